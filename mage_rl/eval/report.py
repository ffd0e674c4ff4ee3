"""Results, tables and plots of evaluation runs (``mage eval``, ``mage report``).

A run folder's records are the source of truth: :func:`collect_run` recomputes every
metric from ``records/`` with ``config.json`` and ``tasks.json``, so a report can be
rebuilt at any time, also from an interrupted run (its incomplete cells are marked).
:func:`write_report` lays one or several runs out as

* ``results.json`` (one run) or ``report.json`` (several): metrics with intervals,
  stamped with the writer's provenance (:func:`mage_rl.provenance.write_results`);
* ``table.md`` (:mod:`mage_rl.eval.tables`): the paper's Table 1 (methods x tasks,
  success@K), then success@k per k, per opponent and seat, and for Kuhn Poker ev@k
  beside the oracle's values;
  and, for games with few decision states, what each agent answered at each state
  (:mod:`mage_rl.eval.decisions`);
* ``plots/success_at_k_<env>.png`` (one line per agent) and
  ``plots/success_at_k_<env>_by_opponent.png`` (one panel per opponent), by
  :mod:`mage_rl.eval.plots`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mage_rl.envs import Population
from mage_rl.eval.decisions import counts_by_episode, small_game_counts
from mage_rl.eval.eval_folder import RecordLog, records_path
from mage_rl.eval.metrics import summarize_with_intervals
from mage_rl.eval.oracles import kuhn_oracle
from mage_rl.eval.plots import write_plots
from mage_rl.eval.tables import SEATS, fmt_mean, fmt_rate, render_markdown
from mage_rl.fileio import atomic_write_text
from mage_rl.provenance import write_results

log = logging.getLogger(__name__)

__all__ = [
    "collect_run",
    "fmt_mean",
    "fmt_rate",
    "kuhn_reference",
    "load_run",
    "render_markdown",
    "write_plots",
    "write_report",
    "write_run_report",
]


# -- collecting --------------------------------------------------------------------------


def kuhn_reference(population: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The SPEC §9 oracle values of a Kuhn population, per seat (chips per hand)."""
    oracle = kuhn_oracle(Population(tuple((str(s), float(w)) for s, w in population)))
    return {
        seat.seat: {
            "best_fixed": seat.best_fixed,
            "ceiling": seat.ceiling,
            "nash": seat.nash,
            "best_response": seat.best_response,
        }
        for seat in oracle.seats
    }


def collect_run(run_dir: str | Path) -> dict[str, Any]:
    """Recompute a run's results from its records.

    Only records of the run's own task instances count; a cell with fewer meta-episodes
    than ``n x rollouts`` is marked ``complete: false``.

    Raises:
        FileNotFoundError: ``run_dir`` has no ``config.json`` (not an evaluation run).
    """
    run = Path(run_dir)
    config_path = run / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{run} has no config.json; is it a `mage eval` run folder?")
    config = json.loads(config_path.read_text())
    tasks = json.loads((run / "tasks.json").read_text())
    cond = config["conditions"]
    expected = cond["n"] * cond["rollouts"]
    results: dict[str, dict[str, Any]] = {}
    for agent in config["agents"]:
        label = agent["label"]
        results[label] = {}
        for env in cond["envs"]:
            keys = {(t["seed"], r) for t in tasks[env]["tasks"] for r in range(cond["rollouts"])}
            records = [
                r
                for r in RecordLog(records_path(run, label, env)).read()
                if (r.seed, r.rollout) in keys
            ]
            # A record written twice (two processes on one folder) counts once.
            unique = list({(r.seed, r.rollout): r for r in records}.values())
            summary = summarize_with_intervals(unique, cond["episodes"], cond["level"])
            summary["expected"] = expected
            summary["complete"] = len(unique) == expected
            decisions = small_game_counts(unique)
            if decisions:
                summary["decisions"] = decisions
                summary["decisions_by_episode"] = {
                    str(e): c for e, c in counts_by_episode(unique).items()
                }
            results[label][env] = summary
    reference = {}
    if "kuhn_poker" in cond["envs"]:
        reference["kuhn_poker"] = kuhn_reference(tasks["kuhn_poker"]["population"])
    seat_share = {
        env: {
            seat: sum(t["seat"] == i for t in tasks[env]["tasks"]) / len(tasks[env]["tasks"])
            for i, seat in enumerate(SEATS)
        }
        for env in cond["envs"]
    }
    return {
        "version": config.get("version", 1),
        "run": str(run),
        "name": run.resolve().name,
        "conditions": cond,
        "agents": config["agents"],
        "populations": {env: tasks[env]["population"] for env in cond["envs"]},
        "seat_share": seat_share,
        "oracle": reference,
        "results": results,
    }


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """A run's results: recomputed from its records, or read from ``results.json`` when
    the folder holds only that (e.g. a copied report)."""
    run = Path(run_dir)
    if (run / "config.json").exists():
        return collect_run(run)
    if (run / "results.json").exists():
        return json.loads((run / "results.json").read_text())
    raise FileNotFoundError(f"{run} holds neither config.json nor results.json")


# -- writing -----------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def write_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    *,
    started: float | None = None,
) -> Path:
    """Rebuild tables and plots from saved runs.

    Args:
        run_dirs: One or more run folders.
        out_dir: Where to write; default the run folder itself when there is one run.
        started: ``time.time()`` when the command began, for the JSON's provenance.

    Returns:
        The markdown table's path.

    Raises:
        ValueError: Several runs and no ``out_dir``.
    """
    if not run_dirs:
        raise ValueError("no run folder given; pass one or more RUN_DIRs")
    if out_dir is None:
        if len(run_dirs) > 1:
            raise ValueError("several runs: say where the combined report goes with --out DIR")
        out_dir = run_dirs[0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = [load_run(d) for d in run_dirs]
    if len(runs) == 1 and Path(run_dirs[0]).resolve() == out.resolve():
        write_results(out / "results.json", runs[0], started=started)
    else:
        write_results(out / "report.json", {"runs": runs}, started=started)
    table = out / "table.md"
    _write_text(table, render_markdown(runs))
    for path in write_plots(runs, out):
        log.info("wrote %s", path)
    return table


def write_run_report(run_dir: str | Path, *, started: float | None = None) -> dict[str, Any]:
    """Write one run's ``results.json``, ``table.md`` and plots; returns the results."""
    write_report([run_dir], started=started)
    return json.loads((Path(run_dir) / "results.json").read_text())
