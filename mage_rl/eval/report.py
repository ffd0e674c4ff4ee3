"""Results, tables and plots of evaluation runs (``mage eval``, ``mage report``).

A run folder's records are the source of truth: :func:`collect_run` recomputes every
metric from ``records/`` with ``config.json`` and ``tasks.json``, so a report can be
rebuilt at any time, also from an interrupted run (its incomplete cells are marked).
:func:`write_report` lays one or several runs out as

* ``results.json`` (one run) or ``report.json`` (several): metrics with intervals;
* ``table.md``: the paper's Table 1 (methods x tasks, success@K), then success@k per
  k, per opponent and seat, and for Kuhn Poker ev@k beside the oracle's values;
* ``plots/success_at_k_<env>.png`` (one line per agent) and
  ``plots/success_at_k_<env>_by_opponent.png`` (one panel per opponent).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mage_rl.eval.metrics import summarize_with_intervals
from mage_rl.fileio import atomic_write_text

log = logging.getLogger(__name__)

ENV_TITLES = {"kuhn_poker": "Kuhn Poker", "tic_tac_toe": "Tic-Tac-Toe", "sokoban": "Sokoban"}
SEATS = ("first", "second")


# -- collecting --------------------------------------------------------------------------


def kuhn_reference(population: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The SPEC §9 oracle values of a Kuhn population, per seat (chips per hand)."""
    from mage_rl.envs import Population
    from mage_rl.eval.oracles import kuhn_oracle

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
    from mage_rl.eval.harness import RecordLog, records_path

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


# -- formatting --------------------------------------------------------------------------


def fmt_rate(est: dict[str, Any] | None) -> str:
    """``0.375 [0.14, 0.69]`` for a rate estimate; ``-`` when there is none."""
    if not est or est.get("mean") is None:
        return "-"
    if est.get("low") is None:
        return f"{est['mean']:.3f}"
    return f"{est['mean']:.3f} [{est['low']:.2f}, {est['high']:.2f}]"


def fmt_mean(est: dict[str, Any] | None) -> str:
    """``+0.125 [-0.31, +0.56]`` for a signed mean estimate."""
    if not est or est.get("mean") is None:
        return "-"
    if est.get("low") is None:
        return f"{est['mean']:+.3f}"
    return f"{est['mean']:+.3f} [{est['low']:+.2f}, {est['high']:+.2f}]"


def fmt_share(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def short_opponent(spec: str) -> str:
    """``kuhn_poker:conservative`` -> ``conservative``."""
    return spec.split(":", 1)[1] if ":" in spec else spec


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], text: int = 1) -> list[str]:
    """A markdown table; the first ``text`` columns are left-aligned, numbers right."""
    align = [":--"] * text + ["--:"] * (len(header) - text)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _rows(runs: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(row name, run, agent label) for every agent; the run name is appended to labels
    that occur in more than one run."""
    labels = [a["label"] for run in runs for a in run["agents"]]
    out = []
    for run in runs:
        for agent in run["agents"]:
            label = agent["label"]
            name = label if labels.count(label) == 1 else f"{label} ({run['name']})"
            out.append((name, run, label))
    return out


def _envs(runs: Sequence[dict[str, Any]]) -> list[str]:
    envs: list[str] = []
    for run in runs:
        envs += [e for e in run["conditions"]["envs"] if e not in envs]
    return envs


def _cell(run: dict[str, Any], label: str, env: str) -> dict[str, Any] | None:
    return run["results"].get(label, {}).get(env)


def _mark(cell: dict[str, Any]) -> str:
    return "" if cell.get("complete", True) else f" ({cell['n']}/{cell['expected']})"


def _conditions_lines(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = []
    for run in runs:
        c = run["conditions"]
        agents = ", ".join(
            f"{a['label']} = {a['style']} on {a.get('endpoint_model') or a['model']}"
            for a in run["agents"]
        )
        lines.append(
            f"- `{run['name']}`: {agents}. Opponents `{c['opponents']}`, n = {c['n']} task "
            f"instances x {c['rollouts']} rollout(s) per environment (base seed {c['seed']}, "
            f"seat {c['seat']}), K = {c['episodes']}, protocol {c['protocol']}, "
            f"stop_on_success {c['stop_on_success']}; sampling temperature "
            f"{c['temperature']}, top-p {c['top_p']}, top-k {c['top_k']}; max_tokens "
            f"{c['max_tokens']} (reflect {c['reflect_max_tokens']}); {c['level']:.0%} "
            "intervals."
        )
    return lines


def render_markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The report's tables as markdown (see the module docstring)."""
    envs = _envs(runs)
    rows = _rows(runs)
    out = ["# Evaluation", "", *_conditions_lines(runs), ""]
    ks = {run["conditions"]["episodes"] for run in runs}
    k_text = f"K = {ks.pop()}" if len(ks) == 1 else "each run's K"
    out += [
        f"## Success rate (success@K, {k_text}), laid out like the paper's Table 1",
        "",
        "Wilson intervals in brackets; (m/n) marks an unfinished cell.",
        "",
    ]
    table = []
    for name, run, label in rows:
        cells = []
        for env in envs:
            cell = _cell(run, label, env)
            cells.append(fmt_rate(cell["success@k"][-1]) + _mark(cell) if cell else "-")
        table.append([name, *cells])
    out += _table(["Method", *(ENV_TITLES.get(e, e) for e in envs)], table) + [""]

    for env in envs:
        title = ENV_TITLES.get(env, env)
        kmax = max(
            run["conditions"]["episodes"] for run in runs if env in run["conditions"]["envs"]
        )
        out += [f"## {title}", "", "### success@k and answer quality", ""]
        header = ["Agent", *(f"success@{k}" for k in range(1, kmax + 1))]
        header += ["draw@K", "n", "invalid share", "cut by max_tokens", "no <remark>"]
        table = []
        for name, run, label in rows:
            cell = _cell(run, label, env)
            if not cell:
                continue
            succ = [fmt_rate(e) for e in cell["success@k"]]
            succ += ["-"] * (kmax - len(succ))
            turns = cell["turns"]
            table.append(
                [
                    name,
                    *succ,
                    fmt_rate(cell["draw@k"][-1]),
                    f"{cell['n']}{_mark(cell)}",
                    fmt_share(turns["invalid_share"]),
                    fmt_share(turns["truncated_share"]),
                    fmt_share(turns["reflect_invalid_share"]),
                ]
            )
        out += _table(header, table) + [""]
        out += [
            "invalid share: play turns with no parsable, legal `<action>`; cut by "
            "max_tokens: play turns that hit the token budget; no <remark>: reflect turns "
            "without a reflection tag.",
            "",
            "### success@K per opponent and seat",
            "",
        ]
        header = ["Agent", "opponent", "seat", "n", "success@K", "draw@K"]
        table = []
        for name, run, label in rows:
            cell = _cell(run, label, env)
            if not cell:
                continue
            for key, sub in cell["by_opponent_seat"].items():
                opponent, seat = key.rsplit("|", 1)
                table.append(
                    [
                        name,
                        short_opponent(opponent),
                        seat,
                        str(sub["n"]),
                        fmt_rate(sub["success@k"][-1]),
                        fmt_rate(sub["draw@k"][-1]),
                    ]
                )
        out += _table(header, table, text=3) + [""]
        if env == "kuhn_poker":
            out += _kuhn_ev_section(runs, rows, kmax)
    return "\n".join(out).rstrip() + "\n"


def _kuhn_ev_section(
    runs: Sequence[dict[str, Any]], rows: Sequence[tuple[str, dict[str, Any], str]], kmax: int
) -> list[str]:
    """ev@k per agent and seat, beside the oracle's best-fixed and ceiling values."""
    out = [
        "### Kuhn Poker chips per hand (ev@k) beside the oracle",
        "",
        "Student-t intervals. best fixed: the most a single strategy earns against the "
        "population when the opponent is unknown; ceiling: what knowing the opponent "
        "earns (SPEC §9, fresh deals). Per opponent, both are the best response to it. "
        "Rows `all` weigh the seats by their share of task instances. With "
        "stop_on_success, ev@k for k > 1 averages only the meta-episodes not yet won, and "
        "under the replay protocol every episode replays one deal, so compare ev@1 with "
        "best fixed, and ev@K with the ceiling only for `--protocol fresh "
        "--no-stop-on-success` runs. hands@1: first hands that reached a showdown or "
        "fold; hands abandoned after invalid answers have no chip payoff and are left out "
        "of ev@k (they are counted in the invalid share).",
        "",
    ]
    header = ["Agent", "opponent", "seat", *(f"ev@{k}" for k in range(1, kmax + 1))]
    header += ["hands@1", "best fixed", "ceiling"]
    table = []
    for name, run, label in rows:
        cell = _cell(run, label, "kuhn_poker")
        oracle = run.get("oracle", {}).get("kuhn_poker")
        if not cell or not oracle:
            continue
        share = run["seat_share"]["kuhn_poker"]
        groups: list[tuple[str, str, dict[str, Any], str | None]] = [("all", "all", cell, None)]
        if len(cell["by_seat"]) > 1:  # with one seat its row would repeat the first
            groups += [("all", s, cell["by_seat"][s], s) for s in SEATS if s in cell["by_seat"]]
        for key, sub in cell["by_opponent_seat"].items():
            opponent, seat = key.rsplit("|", 1)
            groups.append((opponent, seat, sub, seat))
        for opponent, seat, sub, seat_key in groups:
            ev = sub.get("ev@k", [])
            evs = [fmt_mean(e) for e in ev] + ["-"] * (kmax - len(ev))
            hands = str(ev[0]["n"]) if ev else "0"
            if opponent != "all":
                br = oracle[seat]["best_response"].get(opponent)
                refs = [f"{br:+.4f}"] * 2 if br is not None else ["-", "-"]
            elif seat_key is None:
                refs = [
                    f"{sum(share[s] * oracle[s][k] for s in SEATS):+.4f}"
                    for k in ("best_fixed", "ceiling")
                ]
            else:
                refs = [f"{oracle[seat_key][k]:+.4f}" for k in ("best_fixed", "ceiling")]
            table.append([name, short_opponent(opponent), seat, *evs, hands, *refs])
    return [*out, *_table(header, table, text=3), ""]


# -- plots -------------------------------------------------------------------------------


def _plot_lines(ax: Any, series: Sequence[tuple[str, list[dict[str, Any]]]]) -> None:
    for i, (name, ests) in enumerate(series):
        ks = [k + 1 for k, e in enumerate(ests) if e["mean"] is not None]
        means = [e["mean"] for e in ests if e["mean"] is not None]
        lows = [m - e["low"] for m, e in zip(means, ests, strict=False)]
        highs = [e["high"] - m for m, e in zip(means, ests, strict=False)]
        # Offset agents a little along k, so overlapping intervals stay readable.
        xs = [k + 0.04 * (i - (len(series) - 1) / 2) for k in ks]
        ax.errorbar(xs, means, yerr=[lows, highs], marker="o", capsize=3, label=name)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("k (episodes)")
    ax.set_ylabel("success@k")
    ax.grid(alpha=0.3)


def write_plots(runs: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """success@k against k: one PNG per environment (a line per agent) and one per
    environment with a panel per opponent."""
    from matplotlib.figure import Figure  # the Agg canvas, no pyplot global state

    plots = Path(out_dir) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    written = []
    rows = _rows(runs)
    for env in _envs(runs):
        found = [(name, _cell(run, label, env)) for name, run, label in rows]
        cells = [(name, c) for name, c in found if c]
        if not cells:
            continue
        kmax = max(len(c["success@k"]) for _, c in cells)
        title = ENV_TITLES.get(env, env)

        fig = Figure(figsize=(5.5, 4), layout="constrained")
        ax = fig.add_subplot()
        _plot_lines(ax, [(f"{name} (n = {c['n']})", c["success@k"]) for name, c in cells])
        ax.set_xticks(range(1, kmax + 1))
        ax.set_title(f"{title}: success@k")
        ax.legend()
        path = plots / f"success_at_k_{env}.png"
        fig.savefig(path, dpi=120)
        written.append(path)

        opponents = sorted({o for _, c in cells for o in c["by_opponent"]})
        cols = min(4, len(opponents))
        nrows = -(-len(opponents) // cols)
        fig = Figure(figsize=(3.6 * cols, 3.2 * nrows), layout="constrained")
        axes = fig.subplots(nrows, cols, squeeze=False, sharey=True)
        for ax, opponent in zip(axes.flat, opponents, strict=False):
            series = [
                (name, c["by_opponent"][opponent]["success@k"])
                for name, c in cells
                if opponent in c["by_opponent"]
            ]
            _plot_lines(ax, series)
            ax.set_xticks(range(1, kmax + 1))
            n = max(c["by_opponent"].get(opponent, {}).get("n", 0) for _, c in cells)
            ax.set_title(f"{short_opponent(opponent)} (n = {n})", fontsize=9)
        for ax in list(axes.flat)[len(opponents) :]:
            ax.set_visible(False)
        axes.flat[0].legend(fontsize=8)
        fig.suptitle(f"{title}: success@k per opponent")
        path = plots / f"success_at_k_{env}_by_opponent.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


# -- writing -----------------------------------------------------------------------------


def _write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None) -> Path:
    """Rebuild tables and plots from saved runs.

    Args:
        run_dirs: One or more run folders.
        out_dir: Where to write; default the run folder itself when there is one run.

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
        _write_text(out / "results.json", json.dumps(runs[0], indent=2) + "\n")
    else:
        _write_text(out / "report.json", json.dumps({"runs": runs}, indent=2) + "\n")
    table = out / "table.md"
    _write_text(table, render_markdown(runs))
    for path in write_plots(runs, out):
        log.info("wrote %s", path)
    return table


def write_run_report(run_dir: str | Path) -> dict[str, Any]:
    """Write one run's ``results.json``, ``table.md`` and plots; returns the results."""
    write_report([run_dir])
    return json.loads((Path(run_dir) / "results.json").read_text())
