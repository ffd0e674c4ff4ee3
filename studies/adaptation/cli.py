"""The study's two commands, run from the checkout's root.

* ``python -m studies.adaptation [FLAGS]``: :func:`adaptation_main`, train every method
  and evaluate it exactly (:func:`~studies.adaptation.study.bench_adaptation`);
* ``python -m studies.adaptation.identification [FLAGS]``: :func:`identification_main`,
  the supervised upper bound (:func:`~studies.adaptation.identification.bench_identification`).

They take the flags ``mage bench adaptation`` and ``mage bench identification`` took
before the study left the package. ``--threads`` sets torch's intra-op threads for the
whole command (learning curves on a CPU depend on it), and every results file records it
with the commit the command started from, the package versions, the CPU, the command
line and the wall time (:func:`mage_rl.provenance.write_results`). The heavy modules are imported only when a
command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

ADAPTATION = ("python", "-m", "studies.adaptation")
IDENTIFICATION = ("python", "-m", "studies.adaptation.identification")


# -- commands ----------------------------------------------------------------------------


def _apply_threads(threads: int | None) -> None:
    """Give torch ``threads`` intra-op threads for the rest of the process (``None``:
    torch's default, one per core); set before any model is built, it holds in the
    threads torch starts later too."""
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads {threads}: give a thread count >= 1")
        torch.set_num_threads(threads)


def _run_adaptation(args: argparse.Namespace, command: list[str]) -> None:
    from mage_rl.rl.pretrain import PretrainSettings
    from studies.adaptation import CONFIG
    from studies.adaptation.results import format_table
    from studies.adaptation.study import METHODS, bench_adaptation

    methods = list(METHODS) if args.methods == "all" else args.methods.split(",")
    sizes = {
        name: value
        for name, value in (("batches", args.pretrain_batches), ("epochs", args.pretrain_epochs))
        if value is not None
    }
    started = time.time()
    _apply_threads(args.threads)
    doc = bench_adaptation(
        config=args.config or CONFIG,
        methods=methods,
        seats=args.seats.split(","),
        seeds=[int(s) for s in args.seeds.split(",")],
        iterations=args.iterations,
        eval_every=args.eval_every,
        out=args.out,
        overrides=[
            *([f"policy.model={args.model}"] if args.model else []),
            *([f"meta.layout={args.layout}"] if args.layout else []),
            *args.set,
        ],
        resume=not args.fresh,
        runs_dir=args.runs_dir,
        pretrain=PretrainSettings(**sizes) if args.pretrain else None,
        minutes=args.minutes,
        log=_say,
        started=started,
        average=args.eval_average,
        command=command,
    )
    print(format_table(doc))
    _say(f"results: {args.out}")


def _run_identification(args: argparse.Namespace, command: list[str]) -> None:
    from mage_rl.provenance import write_results
    from studies.adaptation import CONFIG
    from studies.adaptation.identification import bench_identification

    started = time.time()
    _apply_threads(args.threads)
    result = bench_identification(
        config=args.config or CONFIG,
        model=args.model,
        batches=args.batches,
        epochs=args.epochs,
        seed=args.seed,
        overrides=args.set,
        log=_say,
    )
    _say(
        f"{result['model']}: {result['train']} labelled decisions, held-out accuracy "
        f"{result['final_accuracy']:.3f} (best {result['best_accuracy']:.3f}); without "
        f"history at best {result['no_history_accuracy']:.3f}, Bayes "
        f"{result['bayes_accuracy']:.3f}; in {result['seconds']:.0f}s"
    )
    if args.json:
        path = write_results(
            args.json, result, started=started, argv=command, threads_requested=args.threads
        )
        _say(f"raw result: {path}")


def _say(line: str) -> None:
    print(line, flush=True)


# -- parsers -----------------------------------------------------------------------------


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help="base config (default: studies/adaptation/kuhn_adaptation_tiny.yaml)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for the whole study (default: one per core); recorded in the results",
    )


def adaptation_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m studies.adaptation``."""
    p = argparse.ArgumentParser(
        prog="python -m studies.adaptation",
        description="Does training on the last episode teach opponent identification? "
        "Trains each method for each seat and seed on Kuhn Poker and evaluates it exactly "
        "against every deal sequence (studies/adaptation/README.md, "
        "studies/adaptation/results/adaptation.md). Minutes to hours.",
    )
    _add_common(p)
    p.add_argument("--methods", default="all", help="comma-separated, or all")
    p.add_argument("--seats", default="first,second")
    p.add_argument("--seeds", default="0", help="training seeds, comma-separated")
    p.add_argument("--iterations", type=int, default=60, help="the budget of every run")
    p.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="also stop a run after this training time (pretraining included)",
    )
    p.add_argument(
        "--pretrain",
        action="store_true",
        help="pretrain the model on game transcripts first (mage pretrain), once per seed",
    )
    p.add_argument(
        "--pretrain-batches", type=int, default=None, help="rollout batches per seat (10)"
    )
    p.add_argument("--pretrain-epochs", type=int, default=None, help="passes over them (4)")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument(
        "--eval-average",
        type=float,
        default=0.0,
        metavar="DECAY",
        help="also evaluate a moving average of the weights with this decay per update "
        "(e.g. 0.95; default 0: no average)",
    )
    p.add_argument(
        "--model", default=None, help="model of every run: tiny (the study's), smollm2 or a path"
    )
    p.add_argument(
        "--layout",
        choices=["rerendered", "conversation"],
        default=None,
        help="prompt layout of every run (default: the config's, rerendered)",
    )
    p.add_argument("--out", default="runs/adaptation/adaptation.json", help="results JSON")
    p.add_argument("--runs-dir", default=None, help="run folders (default: beside --out)")
    p.add_argument("--fresh", action="store_true", help="ignore runs already in --out")
    return p


def identification_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m studies.adaptation.identification``."""
    p = argparse.ArgumentParser(
        prog="python -m studies.adaptation.identification",
        description="Supervised upper bound: can the model learn to read the opponent at "
        "all? Collects labelled last-hand decisions and trains on them "
        "(studies/adaptation/README.md).",
    )
    _add_common(p)
    p.add_argument(
        "--model",
        default=None,
        help="model to collect with and train (default: the config's policy.model)",
    )
    p.add_argument("--seed", type=int, default=0, help="shuffling seed")
    p.add_argument(
        "--batches", type=int, default=20, help="rollout batches of labelled decisions to collect"
    )
    p.add_argument("--epochs", type=int, default=3, help="passes over the training decisions")
    p.add_argument("--json", default=None, help="also write the raw result to this file")
    return p


def _main(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace, list[str]], None],
    entry: Sequence[str],
    argv: Sequence[str] | None,
    check: Callable[[argparse.Namespace], Any] | None = None,
) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if check is not None:
        check(args)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from mage_rl.provenance import mark_start

    mark_start()  # results files name the commit this command started from
    try:
        run(args, [*entry, *argv])
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def adaptation_main(argv: Sequence[str] | None = None) -> int:
    """``python -m studies.adaptation``; returns the exit status (2 on a usage error)."""
    parser = adaptation_parser()

    def check(args: argparse.Namespace) -> None:
        if (args.pretrain_batches, args.pretrain_epochs) != (None, None) and not args.pretrain:
            parser.error("--pretrain-batches and --pretrain-epochs need --pretrain")

    return _main(parser, _run_adaptation, ADAPTATION, argv, check)


def identification_main(argv: Sequence[str] | None = None) -> int:
    """``python -m studies.adaptation.identification``; returns the exit status."""
    return _main(identification_parser(), _run_identification, IDENTIFICATION, argv)
