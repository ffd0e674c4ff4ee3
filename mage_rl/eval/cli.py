"""The ``mage eval`` and ``mage report`` sub-commands.

:func:`register` adds them to the ``mage`` parser (``mage_rl.cli._EXTRA_PARSERS``). The
heavy modules (models, graphs, OpenSpiel) are imported only when a command runs, so
``mage --help`` stays fast; the defaults below therefore repeat those of
:class:`~mage_rl.eval.harness.EvalConfig` (a test keeps them equal).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown

log = logging.getLogger(__name__)
console = Console()

AGENT_HELP = (
    "agent to evaluate, repeatable: STYLE[=MODEL][@LABEL]. STYLE is react, reflexion or "
    "mage; MODEL is tiny, smollm2, a local HF directory or .gguf (e.g. a trained "
    "checkpoint: mage=runs/kuhn/checkpoints/iter_10/model), an endpoint URL, or "
    "'endpoint' for --endpoint; default --model. LABEL names it in tables (default: the "
    "style, or STYLE:MODEL when two agents share a style)."
)


def _print_table_one(table: Path) -> None:
    """Show the Table 1 section of a report in the terminal."""
    sections = table.read_text().split("\n## ")
    if len(sections) > 1:
        console.print(Markdown("## " + sections[1]))


def _cmd_eval(args: argparse.Namespace) -> int:
    from mage_rl.eval.harness import EvalConfig, parse_agents, run_evaluation

    agents = parse_agents(args.agent, args.model, args.endpoint, args.endpoint_model)
    cfg = EvalConfig(
        agents=agents,
        envs=args.env or ["kuhn_poker"],
        opponents=args.opponents,
        n=args.n,
        rollouts=args.rollouts,
        episodes=args.episodes,
        seed=args.seed,
        seat=args.seat,
        protocol=args.protocol,
        stop_on_success=args.stop_on_success,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        reflect_max_tokens=args.reflect_max_tokens,
        max_turns=args.max_turns,
        dtype=args.dtype,
        level=args.level,
        concurrency=args.concurrency,
        max_batch_size=args.max_batch_size,
        prompt=args.prompt,
        constrain_actions=args.constrain_actions,
    )
    try:
        run_evaluation(cfg, args.out, progress=not args.no_progress)
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted[/yellow]; finished meta-episodes are saved in {args.out}. "
            "Rerun the same command to resume."
        )
        return 130
    except RuntimeError as exc:  # endpoint unreachable or failing, engine closed
        console.print(f"[red]error:[/red] {exc}")
        console.print(f"finished meta-episodes are saved; rerun to resume in {args.out}")
        return 2
    out = Path(args.out)
    _print_table_one(out / "table.md")
    console.print(
        f"results: {out / 'results.json'}, tables: {out / 'table.md'}, plots: {out / 'plots'}"
    )
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from mage_rl.eval.report import write_report

    table = write_report(args.run_dirs, args.out)
    _print_table_one(table)
    console.print(f"wrote {table} and plots in {table.parent / 'plots'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``eval`` and ``report`` to the ``mage`` sub-command parser."""
    p = sub.add_parser(
        "eval",
        help="evaluate agents on identical tasks: success@k, draw@k, ev@k with intervals",
        description="Run several agents on the same task instances (environment, "
        "opponents, seeds, seats), with the same K, sampling settings and token budgets. "
        "Writes results.json, table.md and plots/ to --out; rerunning the command resumes "
        "an interrupted evaluation.",
    )
    p.add_argument("--agent", action="append", required=True, metavar="SPEC", help=AGENT_HELP)
    p.add_argument("--out", required=True, metavar="DIR", help="run folder (resumed if it exists)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="ENV",
        help="environment, repeatable: kuhn_poker (kuhn), tic_tac_toe (ttt), sokoban, or "
        "one a plugin registers; default kuhn_poker",
    )
    p.add_argument(
        "--opponents",
        default="train",
        help="opponent set: train (in-distribution: the training populations), unseen "
        "(Kuhn cfr, Tic-Tac-Toe mcts:1000, Sokoban rooms of 1 and 3 boxes), a preset "
        "(kuhn_train...) or weighted specs",
    )
    p.add_argument(
        "--model",
        default="smollm2",
        help="model of agents given without =MODEL: tiny, smollm2 or a local path",
    )
    p.add_argument("--endpoint", default=None, metavar="URL", help="OpenAI-compatible base URL")
    p.add_argument(
        "--endpoint-model",
        default=None,
        metavar="NAME",
        help="model name the endpoint serves (API key: $OPENAI_API_KEY)",
    )
    p.add_argument("--n", type=int, default=32, help="task instances per environment")
    p.add_argument(
        "--rollouts",
        type=int,
        default=1,
        help="meta-episodes per task instance (above 1 the intervals are too narrow)",
    )
    p.add_argument("--episodes", "-k", type=int, default=3, help="K, episodes per meta-episode")
    p.add_argument("--seed", type=int, default=2026, help="base seed of the task instances")
    p.add_argument("--seat", default="sampled", help="agent seat: first, second or sampled")
    p.add_argument(
        "--protocol",
        default="replay",
        choices=["replay", "fresh"],
        help="replay: every episode replays one deal/board (paper); fresh: new deal each",
    )
    p.add_argument(
        "--stop-on-success",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end a meta-episode at its first win, so success@k is Pass@k (default: on)",
    )
    p.add_argument("--temperature", type=float, default=0.7, help="sampling (paper eval: 0.7)")
    p.add_argument("--top-p", type=float, default=0.8, help="nucleus truncation (paper: 0.8)")
    p.add_argument("--top-k", type=int, default=20, help="top-k truncation (paper: 20; 0: off)")
    p.add_argument("--max-tokens", type=int, default=96, help="token budget of a play turn")
    p.add_argument(
        "--reflect-max-tokens",
        type=int,
        default=None,
        help="token budget of a reflect turn (default: 2 x --max-tokens)",
    )
    p.add_argument(
        "--max-turns", type=int, default=None, help="agent turns per episode (game default)"
    )
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--level", type=float, default=0.95, help="confidence level of intervals")
    p.add_argument(
        "--concurrency", type=int, default=16, help="meta-episodes in flight (share batches)"
    )
    p.add_argument("--max-batch-size", type=int, default=32, help="local engine batch limit")
    p.add_argument(
        "--prompt",
        default="standard",
        choices=["standard", "compact"],
        help="play-prompt template (use the one the model was trained with)",
    )
    p.add_argument(
        "--constrain-actions",
        action="store_true",
        help="constrained decoding on play turns, as policy.constrain_actions in training",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser(
        "report",
        help="rebuild tables and plots from saved evaluation runs",
        description="Recompute metrics from the records of one or more `mage eval` run "
        "folders and write table.md and plots/ (and results.json or report.json).",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="evaluation run folders")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="where to write (default: the run folder; required for several runs)",
    )
    p.set_defaults(func=_cmd_report)
