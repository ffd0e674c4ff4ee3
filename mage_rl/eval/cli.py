"""The ``mage eval`` and ``mage report`` sub-commands.

:func:`register` adds them to the ``mage`` parser. The flags of the evaluation
settings come from :class:`~mage_rl.eval.settings.EvalSettings`, the one definition of
their defaults and help that :class:`~mage_rl.eval.conditions.EvalConfig` also uses. The
heavy modules (models, graphs, OpenSpiel) are imported only when a command runs, so
``mage --help`` stays fast.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rich.markdown import Markdown

from mage_rl.console import console, error, notice
from mage_rl.eval.settings import add_arguments, settings_from_args

log = logging.getLogger(__name__)

AGENT_HELP = (
    "agent to evaluate, repeatable: STYLE[=MODEL][@LABEL]. STYLE is react, reflexion or "
    "mage; MODEL is tiny, smollm2, a local HF directory or .gguf (e.g. a trained "
    "checkpoint: mage=runs/kuhn/checkpoints/iter_000010/model), a training run "
    "(NAME=runs/X plays as the run trained it), an endpoint URL, or 'endpoint' for "
    "--endpoint; default --model. NAME=http://HOST:PORT/v1 with a NAME that is no style "
    "plays the agent that server serves (mage serve RUN --agent). LABEL names it in "
    "tables (default: the style, or STYLE:MODEL when two agents share a style)."
)


def _print_table_one(table: Path) -> None:
    """Show the Table 1 section of a report in the terminal."""
    sections = table.read_text().split("\n## ")
    if len(sections) > 1:
        console.print(Markdown("## " + sections[1]))


def _cmd_eval(args: argparse.Namespace) -> int:
    from mage_rl.eval.harness import EvalConfig, parse_agents, run_evaluation

    agents = parse_agents(args.agent, args.model, args.endpoint, args.endpoint_model)
    cfg = EvalConfig(agents=agents, **settings_from_args(args))
    try:
        run_evaluation(cfg, args.out, progress=not args.no_progress)
    except KeyboardInterrupt:
        notice(
            "interrupted",
            f"; finished meta-episodes are saved in {args.out}. Rerun the same command to resume.",
        )
        return 130
    except RuntimeError as exc:  # endpoint unreachable or failing, engine closed
        error(exc)
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
    add_arguments(p)  # every evaluation setting, from EvalSettings
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
