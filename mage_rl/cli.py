"""The ``mage`` command line.

Each sub-command lives in a small ``_cmd_*`` function that parses nothing itself and
imports its heavy modules lazily, so ``mage --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.table import Table

from mage_rl.bench.cli import register as register_bench
from mage_rl.cluster.backends import trainer_class
from mage_rl.config import load_config
from mage_rl.console import console, error, heading, notice
from mage_rl.eval.ablation_cli import register as register_ablate
from mage_rl.eval.cli import register as register_eval
from mage_rl.eval.exploitability_cli import register as register_exploitability
from mage_rl.eval.oracle_cli import cmd_oracle
from mage_rl.eval.oracle_cli import register as register_oracle
from mage_rl.fileio import WRITE_FAILED_EXIT, WriteError
from mage_rl.plugins import (
    ENV_VAR,
    PluginError,
    export_plugins,
    load_entry_point_plugins,
    load_plugins,
)
from mage_rl.provenance import mark_start
from mage_rl.rl.phases import process_start_time
from mage_rl.serve.cli import register as register_serve
from mage_rl.train_folder import latest_checkpoint, resume_command
from mage_rl.view.cli import register as register_view

log = logging.getLogger("mage_rl")

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Command] = {}


def _cmd_opponents(args: argparse.Namespace) -> int:
    from mage_rl.envs import POPULATION_PRESETS, available_opponents

    heading("Opponents (spec strings for configs):")
    for usage in available_opponents(args.game):
        console.print(f"  {usage}")
    heading("Population presets:")
    for name in POPULATION_PRESETS.names():
        pop = POPULATION_PRESETS[name]
        members = ", ".join(f"{s}={w:.3g}" for s, w in zip(pop.specs, pop.weights, strict=True))
        console.print(f"  {name}: {members}")
    return 0


# -- matchup -----------------------------------------------------------------------------


def _cmd_matchup(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from mage_rl.envs import POPULATION_PRESETS, Population
    from mage_rl.eval.matchup import kuhn_matchups

    population = Population.parse(args.population, game="kuhn_poker")
    strategies = [s if ":" in s else f"kuhn_poker:{s}" for s in args.strategy] or list(
        POPULATION_PRESETS["kuhn_train"].specs
    )
    total = len(strategies) * len(population.specs) * 2 * args.hands
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("playing hands", total=total)
        results = kuhn_matchups(
            strategies,
            population.specs,
            args.hands,
            seed=args.seed,
            progress=lambda: progress.advance(task),
        )
    table = Table(
        title=f"Scripted Kuhn strategies in the text environment, chips/hand ({args.hands} hands)"
    )
    for col in ("strategy", "opponent", "seat", "measured", "± s.e.", "exact", "invalid"):
        table.add_column(col, justify="left" if col in ("strategy", "opponent") else "right")
    for r in results:
        table.add_row(
            r.strategy.split(":", 1)[1],
            r.opponent.split(":", 1)[1],
            r.seat,
            f"{r.mean_payoff:+.4f}",
            f"{r.stderr:.4f}",
            f"{r.exact:+.4f}",
            str(r.invalid_actions),
        )
    console.print(table)
    args.json = False
    args.game = "kuhn"

    cmd_oracle(args)
    worst = max(abs(r.mean_payoff - r.exact) / max(r.stderr, 1e-9) for r in results)
    console.print(f"largest gap between measured and exact: {worst:.2f} standard errors")
    return 0


# -- rollout and train -------------------------------------------------------------------


def _cmd_rollout(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from mage_rl import runtime
    from mage_rl.graphs.rollouts import summarize, write_jsonl

    cfg = load_config(args.config, args.set)
    engine = runtime.build_engine(cfg.policy)
    llm = runtime.rollout_chat_model(cfg, engine)
    tasks = runtime.tasks_for(cfg, cfg.rollout.tasks, cfg.rollout.seed)
    try:
        with Progress(console=console) as progress:
            bar = progress.add_task("meta-episodes", total=len(tasks) * cfg.rollout.group_size)
            records = runtime.run_rollouts(
                cfg,
                runtime.build_graph(cfg),
                llm,
                tasks,
                cfg.rollout.group_size,
                on_done=lambda _r: progress.advance(bar),
            )
    finally:
        engine.close()
    path = write_jsonl(records, args.out)
    console.print(json.dumps(summarize(records), indent=2))
    console.print(f"wrote {len(records)} meta-episodes to {path}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    overrides = [*args.set, *([f"train.backend={args.backend}"] if args.backend else [])]
    cfg = load_config(args.config, overrides)
    Trainer = trainer_class(cfg.train.backend)
    name = cfg.train.run_name or Path(args.config).stem
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Path(cfg.train.out_dir) / name
        # A fresh run never lands on an old one: runs/NAME, runs/NAME-2, runs/NAME-3, ...
        # A folder without a complete checkpoint holds no run (it is started over in).
        n = 1
        while not args.resume and latest_checkpoint(run_dir) is not None:
            n += 1
            run_dir = Path(cfg.train.out_dir) / f"{name}-{n}"

    def again() -> str:
        return resume_command(args.config, run_dir, args.set, args.backend)

    try:
        trainer = Trainer(
            cfg, run_dir, resume=args.resume, progress=not args.no_progress,
            started=process_start_time(),
        )  # fmt: skip
        try:
            result = trainer.run()
        except KeyboardInterrupt:
            notice("interrupted", f"; resume with: {again()}")
            return 130
    except WriteError as exc:
        # The checkpoints before the failed write are complete: the run resumes from the
        # newest once there is room (docs/training.md, "Disk full").
        error(exc)
        what = "resume" if latest_checkpoint(run_dir) is not None else "start it again"
        console.print(f"free space on that disk, then {what} with: {again()}")
        return WRITE_FAILED_EXIT
    evaluation = result.pop("eval") or {}
    verdict = result.pop("verdict", [])
    if evaluation:
        k = cfg.meta.episodes
        line = ", ".join(f"success@{i + 1} {v:.3f}" for i, v in enumerate(evaluation["success@k"]))
        if "ev@k" in evaluation:
            line += ", " + ", ".join(
                f"ev@{i + 1} {v:+.3f}" for i, v in enumerate(evaluation["ev@k"]) if v is not None
            )
        console.print(f"evaluation ({evaluation['n']} meta-episodes, K={k}): {line}")
    for line in verdict:
        console.print(line)
    for key, value in result.items():
        console.print(f"{key}: {value}")
    return 0


# -- pretrain ----------------------------------------------------------------------------


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from mage_rl.rl.pretrain import PretrainSettings, pretrain

    cfg = load_config(args.config, args.set)
    settings = PretrainSettings(
        batches=args.batches,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        holdout=args.holdout,
    )
    seats = args.seats.split(",") if args.seats else None
    summary = pretrain(cfg, args.out, settings, seats=seats, log=console.print)
    last = summary["epochs"][-1]
    console.print(
        f"pretrained on {summary['sequences']} sequences ({summary['tokens']} tokens) in "
        f"{summary['seconds']:.0f}s; held-out loss {last.get('holdout_loss', float('nan')):.4f}"
    )
    console.print(f"model: {args.out}  (train from it with --set policy.model={args.out})")
    return 0


# -- parser ------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mage",
        description="MAGE: meta-RL for LLM agents (train, evaluate, serve).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="load user code that registers environments, opponents or agents (a module "
        "name or a .py file); repeatable, before the command",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("opponents", help="list opponent specs and population presets")
    p.add_argument(
        "game",
        nargs="?",
        default=None,
        help="an environment name or alias, e.g. kuhn, ttt, leduc (default: all)",
    )
    p.set_defaults(func=_cmd_opponents)

    p = sub.add_parser(
        "matchup",
        help="play scripted Kuhn strategies through the text environment vs exact values",
    )
    p.add_argument(
        "--strategy", action="append", default=[], help="agent strategy spec (repeatable)"
    )
    p.add_argument(
        "--population",
        default="conservative=0.3,aggressive=0.3,intermediate=0.4",
        help="opponents to play against (and the oracle's population)",
    )
    p.add_argument("--hands", type=int, default=2000, help="hands per (strategy, opponent, seat)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_matchup)

    p = sub.add_parser("rollout", help="collect meta-episodes with a config, to JSONL")
    p.add_argument("--config", required=True, help="YAML config (env, meta, policy, rollout)")
    p.add_argument("--out", required=True, help="output JSONL file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override")
    p.set_defaults(func=_cmd_rollout)

    p = sub.add_parser(
        "train",
        help="train an agent with MAGE",
        epilog=f"exit status: 0 done; 2 refused (a config error); {WRITE_FAILED_EXIT} a write "
        "failed (a full disk; the message says how to resume); 130 interrupted; 1 a crash",
    )
    p.add_argument("config", help="YAML training config (see configs/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.add_argument("--run-dir", default=None, help="run folder (default: OUT_DIR/RUN_NAME)")
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.add_argument(
        "--backend",
        choices=["local", "ray", "openrlhf"],
        default=None,
        help="where rollouts and updates run (default: train.backend of the config; "
        "see docs/cluster.md)",
    )
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "pretrain",
        help="next-token pretraining on transcripts of the untrained policy's games",
    )
    p.add_argument("config", help="YAML training config: model, environment, population")
    p.add_argument("--out", required=True, help="directory of the pretrained HF model")
    p.add_argument(
        "--seats", default=None, help="agent seats to play, e.g. first,second (default: env.seat)"
    )
    p.add_argument("--batches", type=int, default=10, help="rollout batches per seat")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=64, help="sequences per step")
    p.add_argument("--holdout", type=int, default=512, help="sequences kept out to report")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override")
    p.set_defaults(func=_cmd_pretrain)

    # Commands whose parsers live beside their code (imported late: they pull in more).

    register_oracle(sub)
    for register in (register_eval, register_ablate, register_exploitability, register_serve,
                     register_bench, register_view):  # fmt: skip
        register(sub)
    return parser


def _load_plugins(argv: Sequence[str] | None) -> int:
    """Load entry-point plugins and the ``--plugin`` ones before the parser is built, so
    that what they register is known to every command; 0 on success."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    try:
        load_entry_point_plugins()
        load_plugins(known.plugin)
    except PluginError as exc:
        error(exc)
        return 2
    export_plugins(known.plugin)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import os

    # A command's --plugin flags reach its child processes through the environment; a
    # later command in the same process (the Python API, tests) starts without them.
    inherited = os.environ.get(ENV_VAR)
    try:
        return _main(argv)
    finally:
        if inherited is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = inherited


def _main(argv: Sequence[str] | None) -> int:
    status = _load_plugins(sys.argv[1:] if argv is None else argv)
    if status:
        return status
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    mark_start()  # results files name the commit this command started from
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for results files' stamps
    try:
        return int(args.func(args) or 0)
    except WriteError as exc:  # a full disk: neither a crash nor a refused command
        error(exc)
        return WRITE_FAILED_EXIT
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        error(exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
