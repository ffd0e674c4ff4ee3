"""Rock-paper-scissors: rules, opponents and exact values."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mage_rl.envs import Population, make_env
from mage_rl.envs.rps import MOVES, counter, payoff
from mage_rl.envs.rps_values import rps_values

TRAIN = {f"rps:always_{m.lower()}": 1.0 for m in MOVES}
UNSEEN = {f"rps:mostly_{m.lower()}": 1.0 for m in MOVES}


def test_a_round_is_scored_and_reported() -> None:
    env = make_env("rps", "rps:always_rock", seat=0)
    assert env.reset(1) == "Choose your move: ROCK, PAPER or SCISSORS."
    result = env.step("<action>PAPER</action>")
    assert result.done and result.reward == 10.0 and result.info.payoff == 1.0
    assert result.info.feedback == "You played PAPER, the opponent played ROCK."
    env.reset(2)
    assert env.step("<action>SCISSORS</action>").info.payoff == -1.0
    env.reset(3)
    assert env.step("<action>ROCK</action>").info.payoff == 0.0
    env.reset(4)
    assert env.step("<action>LIZARD</action>").info.invalid_reason


def test_payoff_and_counter() -> None:
    for a in range(3):
        assert payoff(counter(a), a) == 1 and payoff(a, counter(a)) == -1 and payoff(a, a) == 0


def test_habits_play_their_distribution() -> None:
    env = make_env("rps", "rps:mostly_scissors", seat=0)
    seen = []
    for seed in range(600):
        env.reset(seed)
        seen.append(env.step("<action>ROCK</action>").info.payoff)
    # ROCK wins against SCISSORS (0.6), draws ROCK (0.2), loses to PAPER (0.2).
    assert np.mean(seen) == pytest.approx(0.4, abs=0.08)


def test_exact_values() -> None:
    train = rps_values(TRAIN, 3)
    assert train.best_fixed == 0.0 and train.win_best_fixed == pytest.approx(1 / 3)
    assert train.bayes_last == 1.0 and train.win_bayes_last == 1.0 and train.ceiling == 1.0
    assert rps_values(TRAIN, 1).bayes_last == 0.0
    unseen = rps_values(UNSEEN, 3)
    # Against a habit of 0.6, the best answer earns 0.6 - 0.2.
    assert unseen.ceiling == pytest.approx(0.4)
    # One round seen: the posterior puts 0.6 on the seen habit, the answer to it earns
    # (0.6 * 0.6 + 0.4 * 0.2) - (0.6 * 0.2 + 0.4 * 0.4) = 0.16.
    assert rps_values(UNSEEN, 2).bayes_last == pytest.approx(0.16)
    assert 0.16 < unseen.bayes_last < unseen.ceiling
    # The cycle from ROCK is known before it moves: every round is won.
    assert rps_values({"rps:cycle": 1.0}, 3).bayes_by_round == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="unknown rock-paper-scissors opponent"):
        rps_values({"rps:lizard": 1.0})
    with pytest.raises(ValueError, match="not a rock-paper-scissors opponent"):
        rps_values({"kuhn:aggressive": 1.0})
    assert Population.parse("rps_unseen").specs == [
        f"rock_paper_scissors:mostly_{m.lower()}" for m in MOVES
    ]


def test_oracle_command_prints_the_values() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mage_rl.cli", "oracle", "rps", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    values = json.loads(out.stdout)
    assert [v["episodes"] for v in values] == [1, 2, 3, 4, 5]
    assert values[2]["bayes_last"] == 1.0 and values[2]["best_fixed"] == 0.0


def test_a_game_without_chance_moves_is_stratified_over_opponents_alone() -> None:
    from mage_rl.eval.stratified import stratified_tasks

    design = stratified_tasks(
        "rps", Population.parse("rps_train"), "first", per_stratum=2, num_episodes=3,
        protocol="fresh", base_seed=7,
    )  # fmt: skip
    assert len(design.tasks) == 6 and len(set(design.strata)) == 3
    assert sorted(design.weights.values()) == pytest.approx([1 / 3] * 3)
    assert {t.opponent for t in design.tasks} == set(Population.parse("rps_train").specs)
