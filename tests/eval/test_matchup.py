"""Scripted strategies through the text environment match exact values."""

from __future__ import annotations

from mage_rl.eval.matchup import play_matchup


def test_measured_payoff_matches_exact_value() -> None:
    result = play_matchup("kuhn:aggressive", "kuhn:aggressive", seat=1, hands=600, seed=1)
    assert result.invalid_actions == 0
    assert abs(result.exact - 1 / 3) < 1e-9
    assert abs(result.mean_payoff - result.exact) < 4 * result.stderr
