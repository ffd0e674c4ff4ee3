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

from mage_rl.eval.stats import mean_interval, wilson_interval
from mage_rl.records import MetaEpisodeRecord


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
        vals = [float(p[k - 1]) for p in payoffs if len(p) >= k and p[k - 1] is not None]  # type: ignore[arg-type]
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


# -- with confidence intervals -------------------------------------------------------------


def won_within(outcomes: Sequence[str], k: int) -> bool:
    """Whether a meta-episode was won in one of its first ``k`` episodes (Pass@k)."""
    return any(o == "won" for o in outcomes[:k])


def turn_stats(records: Sequence[MetaEpisodeRecord]) -> dict[str, Any]:
    """How well-formed the agent's answers were: what explains a near-zero score.

    Returns:
        ``play_turns``, ``invalid_share`` (play turns with no parsable, legal action),
        ``truncated_share`` (play turns cut by the token limit), ``reflect_turns``,
        ``reflect_invalid_share`` (no ``<remark>`` tag), ``mean_response_tokens`` and
        ``unfinished_share`` (episodes that ran out of turns without a result).
    """
    plays = [t for r in records for t in r.turns if t.kind == "play"]
    reflects = [t for r in records for t in r.turns if t.kind == "reflect"]
    episodes = [e for r in records for e in r.episodes]
    every = plays + reflects

    def share(items: Sequence[Any], hits: int) -> float | None:
        return hits / len(items) if items else None

    return {
        "play_turns": len(plays),
        "invalid_share": share(plays, sum(t.invalid for t in plays)),
        "truncated_share": share(plays, sum(t.finish_reason == "length" for t in plays)),
        "reflect_turns": len(reflects),
        "reflect_invalid_share": share(reflects, sum(t.invalid for t in reflects)),
        "mean_response_tokens": share(every, sum(t.response_length for t in every)),
        "episodes": len(episodes),
        "unfinished_share": share(episodes, sum(e.outcome == "unfinished" for e in episodes)),
    }


def summarize_with_intervals(
    records: Sequence[MetaEpisodeRecord], k_max: int, level: float = 0.95
) -> dict[str, Any]:
    """SPEC §8 metrics with confidence intervals, overall and per opponent and seat.

    Every metric is a list over k = 1..k_max of :class:`~mage_rl.eval.stats.Estimate`
    dicts (``mean``, ``low``, ``high``, ``n``): Wilson intervals for ``success@k`` and
    ``draw@k``, Student-t intervals for ``ev@k`` (present when the game has chip
    payoffs; its ``n`` is the number of meta-episodes that played episode k, which with
    ``stop_on_success`` excludes those already won).

    Returns:
        A block ``{"n", "success@k", "draw@k", ["ev@k"], "final_reward", "turns"}`` for
        all records, and the same block under ``by_opponent[opponent]``,
        ``by_seat["first"|"second"]`` and ``by_opponent_seat["opponent|seat"]``.
    """

    def block(recs: Sequence[MetaEpisodeRecord]) -> dict[str, Any]:
        outcomes = [[e.outcome for e in r.episodes] for r in recs]
        n = len(recs)
        out: dict[str, Any] = {
            "n": n,
            "success@k": [
                wilson_interval(sum(won_within(o, k) for o in outcomes), n, level).to_dict()
                for k in range(1, k_max + 1)
            ],
            "draw@k": [
                wilson_interval(
                    sum(len(o) >= k and o[k - 1] == "draw" for o in outcomes), n, level
                ).to_dict()
                for k in range(1, k_max + 1)
            ],
        }
        if any(e.payoff is not None for r in recs for e in r.episodes):
            out["ev@k"] = [
                mean_interval(
                    [
                        float(r.episodes[k - 1].payoff)  # type: ignore[arg-type]
                        for r in recs
                        if len(r.episodes) >= k and r.episodes[k - 1].payoff is not None
                    ],
                    level,
                ).to_dict()
                for k in range(1, k_max + 1)
            ]
        finals = [r.episodes[-1].reward for r in recs if r.episodes]
        out["final_reward"] = mean_interval(finals, level).to_dict()
        out["turns"] = turn_stats(recs)
        return out

    def seat_name(record: MetaEpisodeRecord) -> str:
        return "first" if record.seat == 0 else "second"

    groups: dict[str, dict[str, list[MetaEpisodeRecord]]] = {
        "by_opponent": defaultdict(list),
        "by_seat": defaultdict(list),
        "by_opponent_seat": defaultdict(list),
    }
    for r in records:
        groups["by_opponent"][r.opponent].append(r)
        groups["by_seat"][seat_name(r)].append(r)
        groups["by_opponent_seat"][f"{r.opponent}|{seat_name(r)}"].append(r)
    summary = block(records)
    summary["level"] = level
    for name, members in groups.items():
        summary[name] = {key: block(rs) for key, rs in sorted(members.items())}
    return summary
