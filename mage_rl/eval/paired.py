"""Paired comparisons of episode payoffs: the same tasks, played twice or by two agents.

Two evaluations of one run play the same tasks (the same opponents, deals and sampling
seeds), and one meta-episode plays its first and its last episode against the same
opponent. A difference taken task by task cancels what the task decides by itself (the
deal, the opponent's draws), so its interval is narrower than the gap between two
unpaired intervals, and it answers the question asked: is this agent's last episode
better than that one's, on the same tasks?

:func:`paired_difference` estimates the mean of ``a - b`` over the tasks both played,
stratified when the evaluation was (the strata weights of
:class:`~mage_rl.eval.stratified.StratifiedDesign`), with a 95 % interval kept inside the
range a difference can take.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mage_rl.eval.stats import bounded, mean_interval, stratified_mean

if TYPE_CHECKING:
    from mage_rl.eval.stratified import StratifiedDesign

Task = tuple[int, str, int]
"""A task: (seed, opponent, seat)."""


def episode_payoffs(path: Path) -> dict[Task, list[float]]:
    """Per task of an evaluation's ``.jsonl``, each episode's payoff (0 for an episode
    without one, abandoned after invalid answers, as the stratified ev@k counts it)."""
    out: dict[Task, list[float]] = {}
    with path.open() as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                task = (int(row["seed"]), str(row["opponent"]), int(row["seat"]))
                out[task] = [float(e.get("payoff") or 0.0) for e in row["episodes"]]
    return out


def episode_value(payoffs: list[float], index: int) -> float:
    """Episode ``index``'s payoff (``-1``: the last of the meta-episode's K); 0 when the
    meta-episode stopped before it."""
    try:
        return payoffs[index]
    except IndexError:
        return 0.0


def paired_difference(
    a: dict[Task, float],
    b: dict[Task, float],
    bounds: tuple[float | None, float | None] = (None, None),
    design: StratifiedDesign | None = None,
    level: float = 0.95,
) -> dict[str, Any]:
    """The mean of ``a[t] - b[t]`` over the tasks ``t`` both have, with its interval.

    Args:
        a, b: One value per task.
        bounds: The range of one value; the difference's interval stays inside
            ``[low - high, high - low]``.
        design: The stratified design the tasks were drawn from: the mean is then the
            strata-weighted one, as the stratified ev@k is.

    Returns:
        ``{"tasks": n, "stratified": bool, "difference": Estimate dict}``.
    """
    shared = sorted(set(a) & set(b))
    diffs = [a[t] - b[t] for t in shared]
    low, high = bounds
    span = (low - high, high - low) if low is not None and high is not None else (None, None)
    keys = None
    if design is not None:
        strata = {
            (t.seed, t.opponent, t.seat): k
            for t, k in zip(design.tasks, design.strata, strict=True)
        }
        keys = [strata.get(t) for t in shared]
    stratified = design is not None and keys is not None and all(k is not None for k in keys)
    if stratified:
        est = stratified_mean(diffs, keys, design.weights, level, span)  # type: ignore[arg-type,union-attr]
    else:
        est = bounded(mean_interval(diffs, level), *span, level=level)
    return {"tasks": len(shared), "stratified": stratified, "difference": est.to_dict()}
