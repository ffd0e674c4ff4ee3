"""Metrics on hand-made outcome lists (Pass@k with stop_on_success) and the confidence
intervals against known values."""

from __future__ import annotations

import math

import pytest

from mage_rl.eval.metrics import (
    draw_at_k,
    ev_at_k,
    success_at_k,
    summarize_with_intervals,
    turn_stats,
    won_within,
)
from mage_rl.eval.stats import (
    mean_interval,
    normal_quantile,
    t_cdf_two_sided,
    t_quantile,
    wilson_interval,
)
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn

# Four meta-episodes played with stop_on_success and K = 3: a win ends the meta-episode.
OUTCOMES = [
    ["won"],  # won at once
    ["lost", "won"],  # won on the second try
    ["lost", "lost", "lost"],  # never
    ["draw", "lost", "won"],  # won last
]


def test_success_at_k_is_pass_at_k() -> None:
    # A win at episode j counts for every k >= j, although later episodes were not played.
    assert success_at_k(OUTCOMES, 3) == [1 / 4, 2 / 4, 3 / 4]
    assert [won_within(o, 2) for o in OUTCOMES] == [True, True, False, False]


def test_draw_at_k_counts_only_played_episodes() -> None:
    # Episode 2 of the first meta-episode was never played: not a draw.
    assert draw_at_k(OUTCOMES, 3) == [1 / 4, 0.0, 0.0]
    assert draw_at_k([["draw", "draw", "draw"]], 3) == [1.0, 1.0, 1.0]


def test_ev_at_k_averages_meta_episodes_that_played_k() -> None:
    payoffs = [[1.0], [-1.0, 2.0], [-1.0, -2.0, -1.0], [None, -1.0, 1.0]]
    # ev@1 over three payoffs (None is an abandoned hand), ev@2 over three, ev@3 over two.
    assert ev_at_k(payoffs, 3) == [-1 / 3, -1 / 3, 0.0]
    assert ev_at_k([], 2) == [None, None]


def _record(seed: int, outcomes: list[str], opponent: str, seat: int, payoffs=None):
    payoffs = payoffs or [None] * len(outcomes)
    episodes = [
        EpisodeResult(index=i, outcome=o, reward=1.0 if o == "won" else -1.0, payoff=p)
        for i, (o, p) in enumerate(zip(outcomes, payoffs, strict=True))
    ]
    turns = [
        Turn(kind="play", episode=i, step=0, invalid=o == "unfinished", response_length=10)
        for i, o in enumerate(outcomes)
    ]
    return MetaEpisodeRecord(
        uid=f"u{seed}", rollout=0, env="kuhn_poker", seed=seed, opponent=opponent,
        seat=seat, episodes=episodes, turns=turns,
    )  # fmt: skip


def test_summary_with_intervals_overall_and_per_opponent_and_seat() -> None:
    records = [
        _record(1, ["won"], "a", 0, [1.0]),
        _record(2, ["lost", "won"], "a", 1, [-1.0, 2.0]),
        _record(3, ["lost", "lost", "lost"], "b", 0, [-1.0, -2.0, -1.0]),
        _record(4, ["unfinished", "lost", "won"], "b", 1, [None, -1.0, 1.0]),
    ]
    s = summarize_with_intervals(records, 3, level=0.95)
    assert s["n"] == 4 and s["level"] == 0.95
    assert [e["mean"] for e in s["success@k"]] == [0.25, 0.5, 0.75]
    assert s["success@k"][2] == wilson_interval(3, 4).to_dict()
    assert [e["n"] for e in s["ev@k"]] == [3, 3, 2]
    assert s["ev@k"][0] == mean_interval([1.0, -1.0, -1.0]).to_dict()
    assert s["by_opponent"]["a"]["n"] == 2
    assert [e["mean"] for e in s["by_opponent"]["a"]["success@k"]] == [0.5, 1.0, 1.0]
    assert [e["mean"] for e in s["by_opponent"]["b"]["success@k"]] == [0.0, 0.0, 0.5]
    assert set(s["by_seat"]) == {"first", "second"}
    assert s["by_opponent_seat"]["b|second"]["success@k"][2]["mean"] == 1.0
    turns = s["turns"]
    assert turns["play_turns"] == 9 and turns["invalid_share"] == pytest.approx(1 / 9)
    assert turns["unfinished_share"] == pytest.approx(1 / 9)


def test_summary_without_payoffs_has_no_ev() -> None:
    s = summarize_with_intervals([_record(1, ["draw", "won"], "x", 0)], 2)
    assert "ev@k" not in s
    assert s["draw@k"][0]["mean"] == 1.0 and s["draw@k"][1]["mean"] == 0.0


def test_turn_stats_of_no_records() -> None:
    stats = turn_stats([])
    assert stats["play_turns"] == 0 and stats["invalid_share"] is None


# -- intervals -----------------------------------------------------------------------------


def test_wilson_known_values() -> None:
    z = normal_quantile(0.95)
    assert z == pytest.approx(1.959964, abs=1e-6)
    est = wilson_interval(3, 8)
    assert est.mean == 0.375
    assert (est.low, est.high) == (
        pytest.approx(0.136844, abs=1e-6),
        pytest.approx(0.694258, abs=1e-6),
    )
    # At 0 successes the interval is [0, z^2 / (n + z^2)]; at n it mirrors.
    zero = wilson_interval(0, 8)
    assert zero.low == 0.0 and zero.high == pytest.approx(z * z / (8 + z * z))
    full = wilson_interval(8, 8)
    assert full.high == 1.0 and full.low == pytest.approx(1 - zero.high)
    assert wilson_interval(0, 0).mean is None


def test_wilson_widens_with_level_and_shrinks_with_n() -> None:
    assert wilson_interval(5, 10, 0.99).low < wilson_interval(5, 10, 0.9).low
    small, large = wilson_interval(5, 10), wilson_interval(500, 1000)
    assert large.high - large.low < small.high - small.low
    # Large n: close to the normal interval p +- z sqrt(p(1-p)/n).
    half = normal_quantile(0.95) * math.sqrt(0.25 / 1000)
    assert large.high - 0.5 == pytest.approx(half, rel=1e-2)


@pytest.mark.parametrize(
    ("level", "df", "expected"),
    [(0.95, 1, 12.706205), (0.95, 2, 4.302653), (0.95, 3, 3.182446), (0.95, 10, 2.228139),
     (0.99, 5, 4.032143), (0.90, 30, 1.697261)],
)  # fmt: skip
def test_t_quantile_table_values(level: float, df: int, expected: float) -> None:
    assert t_quantile(level, df) == pytest.approx(expected, abs=1e-5)
    assert t_cdf_two_sided(expected, df) == pytest.approx(level, abs=1e-6)


def test_t_quantile_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 4, 7, 15, 64, 500):
        for level in (0.5, 0.8, 0.95, 0.999):
            assert t_quantile(level, df) == pytest.approx(
                stats.t.ppf(0.5 + level / 2, df), rel=1e-9
            )
    assert t_quantile(0.95, 10_000) == pytest.approx(normal_quantile(0.95), rel=1e-3)


def test_mean_interval_hand_computed() -> None:
    est = mean_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182446 * math.sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3 / 4)  # s^2 = 5/3
    assert est.mean == 2.5 and est.n == 4
    assert est.low == pytest.approx(2.5 - half, abs=1e-5)
    assert est.high == pytest.approx(2.5 + half, abs=1e-5)
    assert mean_interval([0.5]).low is None and mean_interval([]).mean is None
    # Order of the samples does not matter.
    assert mean_interval([4.0, 1.0, 3.0, 2.0]) == est


def test_interval_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="confidence level"):
        wilson_interval(1, 4, level=95)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_cdf_two_sided(1.0, 0)
