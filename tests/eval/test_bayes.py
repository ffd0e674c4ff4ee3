"""Bayes last-hand values (SPEC §9)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from mage_rl.envs import Population
from mage_rl.envs.opponents import make_opponent
from mage_rl.eval.bayes import bayes_last_hand, hand_table, observation_likelihood

POPULATION = Population.parse("kuhn_train", game="kuhn_poker")


def test_first_seat_values_match_spec() -> None:
    values = bayes_last_hand(POPULATION, 0, (1, 2, 3, 4, 5))
    # SPEC §9: best fixed 0.0833, then 0.1944 (K=2), 0.2426, 0.2642, 0.2742.
    expected = {1: 0.0833, 2: 0.1944, 3: 0.2426, 4: 0.2642, 5: 0.2742}
    for k, v in expected.items():
        assert values["fixed"][k] == pytest.approx(v, abs=5e-5)
        assert values["adaptive"][k] >= values["fixed"][k] - 1e-9


def test_second_seat_starts_at_best_fixed_and_grows_below_the_ceiling() -> None:
    values = bayes_last_hand(POPULATION, 1, (1, 2, 3))
    assert values["fixed"][1] == pytest.approx(1 / 6)
    assert values["fixed"][1] < values["fixed"][2] < values["fixed"][3] < 0.2667


def test_hand_table_best_responses_match_spec() -> None:
    table = hand_table(POPULATION.specs, 0)
    # Best response per opponent, agent first: 1/6, 1/3, 1/3 (SPEC §9).
    assert table.values.max(axis=0) == pytest.approx([1 / 6, 1 / 3, 1 / 3])
    for lik in table.likelihoods:  # each strategy's observations are a distribution
        assert np.sum(lik, axis=0) == pytest.approx([1, 1, 1])


def test_non_deterministic_opponents_are_refused() -> None:
    from mage_rl.envs import register_opponent

    register_opponent("kuhn", "coin_flip_test", lambda state, player, rng: int(rng.integers(2)))
    mixed = Population((("kuhn_poker:conservative", 0.5), ("kuhn_poker:coin_flip_test", 0.5)))
    with pytest.raises(ValueError, match="deterministically"):
        bayes_last_hand(mixed, 0)


def test_oracle_json_includes_bayes_values() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mage_rl.cli", "oracle", "kuhn", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout)
    assert data["bayes_last_hand"]["first"]["fixed"]["3"] == pytest.approx(0.2426, abs=5e-5)


def test_observation_likelihood_over_the_unseen_card() -> None:
    J, Q, K = 0, 1, 2
    PASS, BET = 0, 1
    opponents = {}
    for name in ("conservative", "aggressive", "intermediate"):
        opponents[name] = make_opponent(f"kuhn_poker:{name}")
        opponents[name].reset(0)
    # Agent first holds Q, passes, and faces a bet: the conservative opponent bets only K,
    # the aggressive one always, the intermediate one K and Q (the agent holds Q).
    facing = (Q, (PASS, BET), -1)
    got = {n: observation_likelihood(o, 0, facing) for n, o in opponents.items()}
    assert got == {"conservative": 0.5, "aggressive": 1.0, "intermediate": 0.5}
    # A showdown after two passes that shows Q: only the conservative opponent checks Q.
    shown = (J, (PASS, PASS), Q)
    got = {n: observation_likelihood(o, 0, shown) for n, o in opponents.items()}
    assert got == {"conservative": 0.5, "aggressive": 0.0, "intermediate": 0.0}
    # Second seat: the agent holds K and sees the opponent open with a bet. The
    # conservative opponent opens only with K, the intermediate one with Q too.
    opened = (K, (BET,), -1)
    got = {n: observation_likelihood(o, 1, opened) for n, o in opponents.items()}
    assert got == {"conservative": 0.0, "aggressive": 1.0, "intermediate": 0.5}
