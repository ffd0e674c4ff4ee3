"""The plots of an evaluation report: success@k against k, per environment and opponent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mage_rl.eval.stats import error_bar
from mage_rl.eval.tables import ENV_TITLES, agent_rows, result_cell, run_envs, short_opponent


def _plot_lines(ax: Any, series: Sequence[tuple[str, list[dict[str, Any]]]]) -> None:
    for i, (name, ests) in enumerate(series):
        shown = [(k + 1, e) for k, e in enumerate(ests) if e["mean"] is not None]
        ks = [k for k, _ in shown]
        means = [e["mean"] for _, e in shown]
        bars = [error_bar(e) for _, e in shown]
        # Offset agents a little along k, so overlapping intervals stay readable.
        xs = [k + 0.04 * (i - (len(series) - 1) / 2) for k in ks]
        yerr = [[b for b, _ in bars], [a for _, a in bars]]
        ax.errorbar(xs, means, yerr=yerr, marker="o", capsize=3, label=name)
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
    rows = agent_rows(runs)
    for env in run_envs(runs):
        found = [(name, result_cell(run, label, env)) for name, run, label in rows]
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
