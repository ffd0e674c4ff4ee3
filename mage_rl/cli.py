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
from typing import Any

from rich.table import Table

from mage_rl.console import console, error, heading, notice
from mage_rl.fileio import WRITE_FAILED_EXIT, WriteError

log = logging.getLogger("mage_rl")

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Command] = {}


def _fmt(x: float) -> str:
    return f"{x:.4f}"


# -- oracle ------------------------------------------------------------------------------


def _cmd_oracle(args: argparse.Namespace) -> int:
    from mage_rl.envs import Population, canonical_game
    from mage_rl.eval.oracles import kuhn_oracle

    game = canonical_game(args.game)
    if game == "rock_paper_scissors":
        from mage_rl.eval.rps_oracle import print_rps_oracle

        return print_rps_oracle(args.population, as_json=args.json, console=console)
    if game != "kuhn_poker":
        return _game_oracle(args, game)
    population = Population.parse(args.population or _KUHN_POPULATION, game="kuhn_poker")
    oracle = kuhn_oracle(population)
    bayes = _bayes_values(population)
    if args.json:
        print(json.dumps(oracle.to_dict() | {"bayes_last_hand": bayes}, indent=2))
        return 0
    title = "Kuhn Poker exact values, chips per hand for the agent"
    table = _oracle_table(oracle, title, tail=[("replay win", lambda s: s.replay_winnable)])
    console.print(table)
    console.print(
        "vs X: best response to X alone; best fixed: best single strategy against the "
        "population; ceiling: best response to each opponent, weighted; replay win: "
        "share of (deal, opponent) pairs where some line of play wins."
    )
    if bayes:
        ks = sorted(next(iter(bayes.values()))["fixed"])
        last = Table(title="Last hand of K (fresh deals): best value after watching K-1 hands")
        last.add_column("agent seat")
        last.add_column("probing")
        for k in ks:
            last.add_column(f"K={k}", justify="right")
        for seat, values in bayes.items():
            for kind in ("fixed", "adaptive"):
                last.add_row(seat, kind, *(_fmt(values[kind][k]) for k in ks))
        console.print(last)
        console.print(
            "fixed: the K-1 earlier hands repeat one pure strategy; adaptive: probing may "
            "change after each hand (Bayes-optimal for a last-hand objective). The last "
            "hand best-responds to the posterior over the opponents."
        )
    return 0


_KUHN_POPULATION = "conservative=0.3,aggressive=0.3,intermediate=0.4"
_ORACLE_GAMES = (
    "kuhn", "kuhn_poker", "leduc", "leduc_poker", "liars", "liars_dice", "rps", "rock_paper_scissors",
)  # fmt: skip


def _game_oracle(args: argparse.Namespace, game: str) -> int:
    """The values of :func:`~mage_rl.eval.game_oracles.game_oracle` as a table or JSON."""
    from mage_rl.envs import Population
    from mage_rl.eval.conditions import GAME_SHORT
    from mage_rl.eval.game_oracles import game_oracle

    text = args.population or f"{GAME_SHORT.get(game, game)}_train"
    iterations = getattr(args, "nash_iterations", None)
    if iterations is not None and iterations < 1:
        raise SystemExit(f"mage oracle: --nash-iterations must be >= 1, got {iterations}")
    population = Population.parse(text, game=game)
    if args.json:  # keep standard output pure JSON
        oracle = game_oracle(game, population, iterations)
    else:
        with console.status(f"solving {game} (CFR+ is cached after the first run)"):
            oracle = game_oracle(game, population, iterations)
    if args.json:
        print(json.dumps(oracle.to_dict(), indent=2))
        return 0
    title = f"{game} exact values, {oracle.payoff_unit} for the agent"
    half_width = ("±", lambda s: (s.nash_high - s.nash_low) / 2)
    table = _oracle_table(oracle, title, head=[half_width])
    console.print(table)
    console.print(
        "Nash ± half-width: the interval that the best responses to the CFR+ average "
        f"profile ({oracle.nash_iterations} iterations) put around the game value; vs X: best response to X alone; best "
        "fixed: best single strategy against the population; ceiling: best response to "
        "each opponent, weighted."
    )
    return 0


_Column = tuple[str, Callable[[Any], float]]


def _oracle_table(
    oracle: Any, title: str, head: Sequence[_Column] = (), tail: Sequence[_Column] = ()
) -> Table:
    """One row per seat: Nash, ``head``, the best response to each opponent, best fixed,
    ceiling, ``tail``; the title ends with the population's weights."""
    pop = ", ".join(f"{s.split(':', 1)[1]}={w:.2f}" for s, w in oracle.population.items())
    versus: list[_Column] = [
        (f"vs {spec.split(':', 1)[1][:5]}.", lambda s, spec=spec: s.best_response[spec])
        for spec in oracle.population
    ]
    columns: list[_Column] = [
        ("Nash", lambda s: s.nash), *head, *versus,
        ("best fixed", lambda s: s.best_fixed), ("ceiling", lambda s: s.ceiling), *tail,
    ]  # fmt: skip
    table = Table(title=f"{title} ({pop})")
    table.add_column("agent seat")
    for name, _ in columns:
        table.add_column(name, justify="right")
    for seat in oracle.seats:
        table.add_row(seat.seat, *(_fmt(value(seat)) for _, value in columns))
    return table


def _bayes_values(population: object) -> dict[str, dict[str, dict[int, float]]]:
    """Bayes last-hand values per seat, or nothing for non-deterministic opponents."""
    from mage_rl.eval.bayes import bayes_last_hand

    try:
        return {
            seat: bayes_last_hand(population, index)  # type: ignore[arg-type]
            for index, seat in enumerate(("first", "second"))
        }
    except ValueError as err:
        log.info("no Bayes last-hand values: %s", err)
        return {}


# -- opponents ---------------------------------------------------------------------------


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
    _cmd_oracle(args)
    worst = max(abs(r.mean_payoff - r.exact) / max(r.stderr, 1e-9) for r in results)
    console.print(f"largest gap between measured and exact: {worst:.2f} standard errors")
    return 0


# -- rollout and train -------------------------------------------------------------------


def _cmd_rollout(args: argparse.Namespace) -> int:

    from rich.progress import Progress

    from mage_rl import runtime
    from mage_rl.config import load_config
    from mage_rl.rl.rollout import summarize, write_jsonl

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
    from mage_rl.cluster.backends import trainer_class
    from mage_rl.config import load_config
    from mage_rl.rl.run_folder import latest_checkpoint, resume_command

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
        trainer = Trainer(cfg, run_dir, resume=args.resume, progress=not args.no_progress)
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
    from mage_rl.config import load_config
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

    p = sub.add_parser(
        "oracle",
        help="exact reference values: Kuhn (SPEC §9), Leduc, Liar's Dice, rock-paper-scissors",
    )
    p.add_argument("game", choices=_ORACLE_GAMES)
    p.add_argument(
        "--population",
        default=None,
        help="weighted opponents, e.g. conservative=0.3,aggressive=0.7, or a preset name "
        "(default: the game's training preset, kuhn_train, leduc_train, liars_dice_train)",
    )
    p.add_argument(
        "--nash-iterations",
        type=int,
        default=None,
        help="CFR+ iterations behind the Nash bounds of Leduc and Liar's Dice (default 500 "
        "and 200); more iterations, tighter bounds, longer first run (then cached)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_oracle)

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
    from mage_rl.bench.cli import register as register_bench
    from mage_rl.eval.cli import register as register_eval
    from mage_rl.eval.exploitability_cli import register as register_exploitability
    from mage_rl.serve.cli import register as register_serve
    from mage_rl.view.cli import register as register_view

    for register in (register_eval, register_exploitability, register_serve, register_bench,
                     register_view):  # fmt: skip
        register(sub)
    return parser


def _load_plugins(argv: Sequence[str] | None) -> int:
    """Load entry-point plugins and the ``--plugin`` ones before the parser is built, so
    that what they register is known to every command; 0 on success."""
    from mage_rl.plugins import PluginError, export_plugins, load_entry_point_plugins, load_plugins

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
    status = _load_plugins(sys.argv[1:] if argv is None else argv)
    if status:
        return status
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from mage_rl.provenance import mark_start

    mark_start()  # results files name the commit this command started from
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
