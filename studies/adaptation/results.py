"""The adaptation study's results file: cells merged across processes, table, curves.

A results file holds ``{"reference", "setup", "results": {METHOD: {SEAT: cell}}}``, where
a cell is :func:`aggregate` of one run per seed. Several study processes may share one
file: each writes its cells with :func:`save_cell`, which merges under a lock instead of
overwriting.
"""

from __future__ import annotations

import fcntl
import json
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mage_rl.provenance import write_results

SEATS = ("first", "second")


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of one (method, seat) cell, with the runs kept."""
    k = len(runs[0]["ev_by_episode"])
    ev = [sum(r["ev_by_episode"][i] for r in runs) / len(runs) for i in range(k)]
    return {
        "ev_by_episode": ev,
        "last_episode_ev": ev[-1],
        "seeds": [r["seed"] for r in runs],
        "train_seconds": [r["train_seconds"] for r in runs],
        "pretrain_seconds": [r.get("pretrain_seconds", 0.0) for r in runs],
        "runs": list(runs),
    }


def save_cell(
    path: Path,
    doc: dict[str, Any],
    name: str,
    seat: str,
    started: float | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Write the ``results[name][seat]`` cell of ``doc`` into the results file.

    Several processes may share one ``--out`` (one per core, say), each with other
    methods, seats or seeds: the file is read again under a lock on its folder and this
    cell merged into it, so no process overwrites what another wrote since it started.
    Within the cell, runs are kept per seed: the file's runs of other seeds stay if they
    had the same budget (iterations, time limit with any pretraining, pretrained start or
    not) and the mean is taken again; runs with another budget are replaced. The file's
    ``provenance`` is that of this last writer (``started``: when its command began);
    each run keeps its own; ``command`` is the command line it records (default:
    ``sys.argv``). Returns the document as written.
    """
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        merged = json.loads(path.read_text()) if path.exists() else {}
        # Pretrained models are per seed: a process of other seeds keeps the file's.
        pretrained = {
            **merged.get("setup", {}).get("pretrain", {}),
            **doc["setup"].get("pretrain", {}),
        }
        merged["reference"], merged["setup"] = doc["reference"], dict(doc["setup"])
        if pretrained:
            merged["setup"]["pretrain"] = pretrained
        cells = merged.setdefault("results", {}).setdefault(name, {})
        cells[seat] = _merge_cell(cells.get(seat), doc["results"][name][seat])
        argv = None if command is None else list(command)
        write_results(path, merged, started=started, argv=argv, indent=1)
    finally:
        os.close(folder)  # closing the descriptor releases the lock
    return merged


def run_budget_seconds(run: dict[str, Any]) -> float | None:
    """A run's whole time limit, pretraining and RL (``max_train_seconds`` in old files)."""
    return run.get("budget_seconds", run.get("max_train_seconds"))


def _budget(run: dict[str, Any]) -> tuple[Any, ...]:
    return (run.get("iterations"), run_budget_seconds(run), bool(run.get("pretrained")))


def _merge_cell(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new``'s runs plus ``old``'s runs of other seeds with the same budget, re-averaged."""
    runs = {r["seed"]: r for r in new.get("runs", [])}
    if not runs or not old:
        return new
    budgets = {_budget(r) for r in runs.values()}
    for run in old.get("runs", []):
        if run["seed"] not in runs and _budget(run) in budgets:
            runs[run["seed"]] = run
    return aggregate([runs[seed] for seed in sorted(runs)])


def format_table(doc: dict[str, Any]) -> str:
    """A Markdown table: ev@k per method and seat, with the reference values."""
    results = doc["results"]
    seats = [s for s in SEATS if any(s in cells for cells in results.values())]
    lines = []
    for seat in seats:
        ref = doc["reference"][seat]
        k = doc["setup"]["episodes"]
        lines.append(
            f"\n**Agent {seat}** (best fixed {ref['best_fixed']:.4f}, target "
            f"{ref['target']:.4f}, Bayes last hand K={k} "
            f"{ref.get(f'bayes_last_hand_k{k}', float('nan')):.4f}, ceiling {ref['ceiling']:.4f})\n"
        )
        header = (
            "| method | " + " | ".join(f"ev@{i + 1}" for i in range(k)) + " | train s | seeds |"
        )
        lines += [header, "|" + "---|" * (k + 3)]
        for name, cells in results.items():
            if seat not in cells:
                continue
            cell = cells[seat]
            evs = " | ".join(f"{v:+.4f}" for v in cell["ev_by_episode"])
            # With pretraining, "P+T": pretraining seconds plus RL training seconds.
            secs = "/".join(
                f"{p:.0f}+{t:.0f}" if p else f"{t:.0f}"
                for p, t in zip(
                    cell.get("pretrain_seconds", [0.0] * len(cell["train_seconds"])),
                    cell["train_seconds"],
                    strict=True,
                )
            )
            seeds = ",".join(str(s) for s in cell["seeds"])
            lines.append(f"| {name} | {evs} | {secs} | {seeds} |")
    return "\n".join(lines)


def _mean_curve(
    runs: Sequence[dict[str, Any]],
) -> tuple[list[int], list[list[float]], list[list[float]]]:
    """Iterations, the mean EV of each episode index over seeds, and each seed's last episode.

    Only the evaluation points every run reached are kept, so runs stopped early by a
    time budget shorten the curve instead of skewing its tail.
    """
    curves = [{p["iteration"]: p["ev_by_episode"] for p in r["curve"]} for r in runs]
    xs = sorted(set.intersection(*(set(c) for c in curves)))
    k = len(curves[0][xs[0]])
    mean = [[sum(c[x][i] for c in curves) / len(curves) for x in xs] for i in range(k)]
    last = [[c[x][-1] for x in xs] for c in curves]
    return xs, mean, last


def plot_curves(doc: dict[str, Any], path: Path) -> Path | None:
    """EV of every episode index against training iterations: one panel per method and seat."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    seats = [s for s in SEATS if any(s in cells for cells in results.values())]
    names = [n for n in results if any(s in results[n] for s in seats)]
    if not seats or not names:
        return None
    fig, axes = plt.subplots(
        len(seats),
        len(names),
        figsize=(3.2 * len(names), 3.0 * len(seats)),
        squeeze=False,
        sharey=True,
    )
    for row, seat in enumerate(seats):
        ref = doc["reference"][seat]
        for col, name in enumerate(names):
            ax = axes[row][col]
            ax.set_title(f"{name}, agent {seat}", fontsize=8)
            for key, style in (("best_fixed", "--"), ("target", "-."), ("ceiling", ":")):
                ax.axhline(ref[key], color="grey", ls=style, lw=0.8)
            if seat not in results[name]:
                ax.text(0.5, 0.5, "not run", transform=ax.transAxes, ha="center", fontsize=8)
                continue
            xs, mean, per_seed = _mean_curve(results[name][seat]["runs"])
            for k, ys in enumerate(mean):
                ax.plot(xs, ys, marker="o", ms=3, label=f"ev@{k + 1}")
            if len(per_seed) > 1:
                ax.set_title(f"{name}, agent {seat}, mean of {len(per_seed)} seeds", fontsize=8)
                for ys in per_seed:  # each seed's last hand, faint
                    ax.plot(xs, ys, color=f"C{len(mean) - 1}", lw=0.7, alpha=0.35)
            if row == len(seats) - 1:
                ax.set_xlabel("iteration", fontsize=8)
            if col == 0:
                ax.set_ylabel("chips per hand (exact, greedy)", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    title = "Kuhn Poker, K hands: grey lines are best fixed (--), target (-.), ceiling (:)"
    # About 14 characters of 9-point text per inch: wrap so one panel shows the whole title.
    width = int(14 * fig.get_figwidth())
    fig.suptitle("\n".join(textwrap.wrap(title, width)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
