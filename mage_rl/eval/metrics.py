"""Meta-episode metrics (SPEC §8).

For meta-episode i and k = 1..K:

- ``success@k`` (the paper's Pass@k): won in any of the first k episodes. With
  ``stop_on_success`` the episodes after a win are not played, and the meta-episode
  counts as a success for every later k.
- ``draw@k``: episode k (1-based) was a draw; a meta-episode that stopped before k
  after a win does not count as a draw.
- ``ev@k`` (games with chips): mean chip payoff of episode k over the meta-episodes that
  played it.

Every metric is also broken down by opponent and by seat.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from mage_rl.rl.records import MetaEpisodeRecord


def success_at_k(outcomes: Sequence[Sequence[str]], k_max: int) -> list[float]:
    """``success@k`` for k = 1..k_max from per-meta-episode outcome lists."""
    if not outcomes:
        return [0.0] * k_max
    return [
        sum(any(o == "won" for o in seq[:k]) for seq in outcomes) / len(outcomes)
        for k in range(1, k_max + 1)
    ]


def draw_at_k(outcomes: Sequence[Sequence[str]], k_max: int) -> list[float]:
    """Share of meta-episodes whose episode k was played and drawn, k = 1..k_max."""
    if not outcomes:
        return [0.0] * k_max
    return [
        sum(len(seq) >= k and seq[k - 1] == "draw" for seq in outcomes) / len(outcomes)
        for k in range(1, k_max + 1)
    ]


def ev_at_k(payoffs: Sequence[Sequence[float | None]], k_max: int) -> list[float | None]:
    """Mean payoff of episode k over meta-episodes that played it (``None`` if none)."""
    out: list[float | None] = []
    for k in range(1, k_max + 1):
        vals = [float(p[k - 1]) for p in payoffs if len(p) >= k and p[k - 1] is not None]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def summarize_records(records: Sequence[MetaEpisodeRecord], k_max: int) -> dict[str, Any]:
    """success@k, draw@k, ev@k (when payoffs exist) and mean final reward, overall and
    per opponent and seat."""

    def block(recs: Sequence[MetaEpisodeRecord]) -> dict[str, Any]:
        outcomes = [[e.outcome for e in r.episodes] for r in recs]
        payoffs = [[e.payoff for e in r.episodes] for r in recs]
        out: dict[str, Any] = {
            "n": len(recs),
            "success@k": success_at_k(outcomes, k_max),
            "draw@k": draw_at_k(outcomes, k_max),
        }
        if any(p is not None for seq in payoffs for p in seq):
            out["ev@k"] = ev_at_k(payoffs, k_max)
        finals = [r.episodes[-1].reward for r in recs if r.episodes]
        out["final_reward"] = sum(finals) / len(finals) if finals else 0.0
        return out

    summary = block(records)
    by_opp: dict[str, list[MetaEpisodeRecord]] = defaultdict(list)
    by_seat: dict[str, list[MetaEpisodeRecord]] = defaultdict(list)
    for r in records:
        by_opp[r.opponent].append(r)
        by_seat["first" if r.seat == 0 else "second"].append(r)
    summary["by_opponent"] = {o: block(rs) for o, rs in sorted(by_opp.items())}
    summary["by_seat"] = {s: block(rs) for s, rs in sorted(by_seat.items())}
    return summary
