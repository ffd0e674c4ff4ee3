"""``mage bench learning``: its parser and command (the suite is :mod:`mage_rl.bench.learning`)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from mage_rl.bench.threads import apply_threads
from mage_rl.console import console


def cmd_learning(args: argparse.Namespace) -> int:
    """Run the probe suite, or one of its two checks, as the flags say."""
    from mage_rl.bench.learning import PROBES, bench_learning, format_learning

    started = time.time()
    apply_threads(args.threads)
    probes = list(PROBES) if args.probes == "all" else args.probes.split(",")
    if args.checkpoint:
        from mage_rl.bench.learning_checks import evaluate_checkpoint, format_transfer

        doc = evaluate_checkpoint(
            args.config, args.checkpoint, args.population or "rps_unseen", out=args.out,
            overrides=args.set, started=started,
        )  # fmt: skip
        print(format_transfer(doc))
        console.print(f"results: {args.out}/transfer.json")
        return 0
    if args.diagnose:
        from mage_rl.bench import learning_checks as checks

        if probes not in (["rps"], ["kuhn_card"], list(PROBES)):
            raise SystemExit("--diagnose takes one probe: --probes rps (the default) or kuhn_card")
        cards = probes == ["kuhn_card"]
        diagnose = checks.diagnose_cards if cards else checks.diagnose_update
        doc = diagnose(
            args.config, out=args.out, overrides=args.set, seed=int(args.seeds.split(",")[0]),
            started=started,
        )  # fmt: skip
        print((checks.format_card_diagnosis if cards else checks.format_diagnosis)(doc))
        console.print(f"results: {args.out}/diagnosis.json")
        return 0
    try:
        doc = bench_learning(
            config=args.config,
            probes=probes,
            seeds=[int(s) for s in args.seeds.split(",")],
            iterations=parse_iterations(args.iterations),
            out=args.out,
            overrides=args.set,
            log=console.print,
            started=started,
            progress=not args.no_progress,
        )
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"mage bench learning: {exc}") from None
    print(format_learning(doc))
    console.print(f"results: {args.out}/learning.json and learning.md")
    return 0


def parse_iterations(text: str | None) -> int | dict[str, int] | None:
    """``--iterations``: ``30`` (every probe) or ``rps=30,kuhn_k3=20`` (by probe)."""
    if text is None:
        return None
    try:
        if "=" not in text:
            return _positive(int(text))
        pairs = [item.split("=", 1) for item in text.split(",")]
        return {name.strip(): _positive(int(count)) for name, count in pairs}
    except ValueError:
        raise SystemExit(
            f"mage bench learning: --iterations {text!r}: give a positive count (30) or "
            "counts by probe (rps=30,kuhn_card=20)"
        ) from None


def _positive(count: int) -> int:
    if count < 1:
        raise ValueError(count)
    return count


def add_learning_parser(benches: Any, add_common: Callable[..., None]) -> None:
    """Add ``learning`` to the ``mage bench`` sub-parsers (``add_common`` adds ``--threads``)."""
    p = benches.add_parser(
        "learning",
        help="the probe suite of the learner: rock-paper-scissors, Kuhn by card, Kuhn K=3",
        description="Trains the same learner settings on three small games and compares "
        "each with its exact reference values: does the model read the opponent's move "
        "(rock-paper-scissors), its card (single Kuhn hands), the opponent in Kuhn Poker's "
        "last hand? See docs/benchmarks.md.",
    )
    p.add_argument(
        "--config",
        default="configs/rps_smollm2.yaml",
        help="the training config whose policy, rollout, returns, advantages and learner "
        "sections every probe uses (default: the main job's)",
    )
    p.add_argument(
        "--probes", default="all", help="comma-separated: rps, kuhn_card, kuhn_k3, showdown"
    )
    p.add_argument("--seeds", default="0", help="comma-separated training seeds")
    p.add_argument(
        "--iterations",
        default=None,
        help="iterations of every probe (30), or of some by name (rps=30,kuhn_card=20); "
        "the others keep their own",
    )
    p.add_argument("--out", default="runs/learning", help="folder of the results and runs")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--diagnose",
        action="store_true",
        help="instead of the probes: one batch of the rps probe (or, with --probes "
        "kuhn_card, of single Kuhn hands), one update per advantage term, and how far each "
        "moves the answers everywhere (context-free) against toward reading the opponent "
        "(the card)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="instead of the probes: play this trained checkpoint (a run's "
        "checkpoints/iter_N/model) as --config plays, against --population",
    )
    p.add_argument(
        "--population", default=None, help="with --checkpoint: the opponents (rps_unseen)"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override")
    add_common(p, json=False)
    p.set_defaults(func=cmd_learning)
