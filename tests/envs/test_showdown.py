"""The showdown: rules, opponents, and exact values checked by brute force (SPEC §11)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mage_rl.envs import make_env
from mage_rl.envs.showdown import LOSS, bluff_rate
from mage_rl.envs.showdown_values import (
    CREDIT_MODES,
    OBJECTIVES,
    credit_weights,
    objective_weights,
    showdown_values,
)

TRAIN = {"showdown:bluffer": 1.0, "showdown:honest": 1.0}
SPEC_POP = {"showdown:bluffer:0.75": 1.0, "showdown:honest": 1.0}


def test_a_bet_is_scored_and_shown() -> None:
    env = make_env("showdown", "showdown:bluffer", seat=1)
    assert env.reset(1) == "The opponent bets. CALL or FOLD?"
    assert env.legal_actions() == ["FOLD", "CALL"]
    won = env.step("<action>CALL</action>")
    assert won.done and won.reward == 10.0 and won.info.payoff == 1.0
    assert "weak hand" in won.info.feedback and won.info.outcome == "won"
    env = make_env("showdown", "showdown:honest", seat=1)
    env.reset(2)
    lost = env.step("<action>call</action>")
    assert lost.reward == -10.0 * LOSS and lost.info.payoff == -LOSS
    assert "strong hand" in lost.info.feedback and lost.info.outcome == "lost"
    env.reset(3)
    folded = env.step("<action>FOLD</action>")
    assert folded.reward == 0.0 and folded.info.outcome == "draw"
    assert "hidden" in folded.info.feedback and "strong" not in folded.info.feedback
    env.reset(4)
    assert env.step("<action>RAISE</action>").info.invalid_reason


def test_the_bettor_seat_is_refused() -> None:
    from mage_rl.config import TrainConfig, load_config

    config = Path(__file__).parents[2] / "configs" / "showdown_smollm2.yaml"
    with pytest.raises(ValueError, match="plays seat second only"):
        load_config(config, ["env.seat=first"], TrainConfig)
    with pytest.raises(ValueError, match="plays seat second only"):
        load_config(config, ["env.seat=sampled"], TrainConfig)
    assert load_config(config, [], TrainConfig).env.seat == "second"


def test_bluff_rates_are_drawn_from_the_episode_seed() -> None:
    env = make_env("showdown", "showdown:bluffer:0.8", seat=1)
    payoffs = []
    for seed in range(500):
        env.reset(seed)
        payoffs.append(env.step("<action>CALL</action>").info.payoff)
    assert np.mean(np.array(payoffs) > 0) == pytest.approx(0.8, abs=0.06)
    again = make_env("showdown", "showdown:bluffer:0.8", seat=1)
    again.reset(7)
    env.reset(7)
    assert (
        env.step("<action>CALL</action>").info.payoff
        == again.step("<action>CALL</action>").info.payoff
    )


@pytest.mark.parametrize(
    "spec", ["showdown:bluffer:1.5", "showdown:bluffer:x", "showdown:liar", "kuhn:cfr"]
)
def test_bad_opponents_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        bluff_rate(spec)


def test_spec_section_11_values() -> None:
    """The table of SPEC §11 (B = 0.75, K = 3)."""
    low = showdown_values(SPEC_POP, 3, loss=1.0)
    final = low.objectives["final"]
    assert final.first_answer == "CALL"
    assert final.episode_values == pytest.approx([-0.25, -0.4375, 0.234375], abs=1e-9)
    assert low.objectives["sum"].episode_values == pytest.approx([-0.25, 0.1875, 0.1875], abs=1e-9)
    assert low.objectives["greedy"].episode_values == [0.0, 0.0, 0.0]
    assert low.call_prior == pytest.approx(-0.25)
    high = showdown_values(SPEC_POP, 3, loss=1.5)
    assert high.objectives["final"].first_answer == "CALL"
    assert high.objectives["final"].last == pytest.approx(0.17578125, abs=1e-9)
    assert high.objectives["sum"].first_answer == "FOLD"
    assert high.objectives["sum"].total == 0.0


def test_the_shipped_game_separates_the_credit_modes() -> None:
    values = showdown_values(TRAIN, 2, gamma_traj=1.0)
    assert values.best_fixed == 0.0 and values.ceiling == pytest.approx(0.5)
    assert values.objectives["final"].first_answer == "CALL"
    assert values.objectives["final"].last == pytest.approx(0.5)
    assert values.objectives["greedy"].first_answer == "FOLD"
    assert values.credit["differential"].first_answer == "CALL"
    assert values.credit["differential"].first_margin == pytest.approx(0.25)
    assert values.credit["single_episode"].first_answer == "FOLD"
    assert values.credit["cumulative"].first_margin == pytest.approx(0.0, abs=1e-12)
    # With the paper's gamma_traj 0.6 the differential credit no longer pays for the probe.
    assert showdown_values(TRAIN, 2, gamma_traj=0.6).credit["differential"].first_answer == "FOLD"


# -- brute force: every deterministic policy over histories, every hand sequence ---------

Obs = str  # "-" folded, "W" a weak hand shown, "S" a strong one


def _histories(episodes: int) -> list[tuple[Obs, ...]]:
    return [h for k in range(episodes) for h in itertools.product("-WS", repeat=k)]


def _paths(population: dict[str, float], episodes: int):
    """(probability, hands) over types and every sequence of hands."""
    total = sum(population.values())
    for spec, weight in population.items():
        b = bluff_rate(spec)
        for hands in itertools.product("WS", repeat=episodes):
            p = weight / total
            for hand in hands:
                p *= b if hand == "W" else 1 - b
            if p > 0:
                yield p, hands


def _play(policy, hands, loss, start=()) -> list[float]:
    """Per-episode payoffs of a policy from history ``start`` along ``hands``."""
    history, payoffs = tuple(start), []
    for hand in hands[len(start) :]:
        if policy[history] == "CALL":
            payoffs.append(1.0 if hand == "W" else -loss)
            history += (hand,)
        else:
            payoffs.append(0.0)
            history += ("-",)
    return payoffs


def _consistent(history, hands) -> bool:
    return all(o == "-" or o == h for o, h in zip(history, hands, strict=False))


def _brute_objective(population, episodes, objective, loss) -> list[float]:
    """The best policy's per-episode values under a fixed objective, by enumeration."""
    nodes = _histories(episodes)
    weights = objective_weights(objective)(0, episodes)
    paths = list(_paths(population, episodes))
    best, best_values = -np.inf, None
    for answers in itertools.product(("FOLD", "CALL"), repeat=len(nodes)):
        policy = dict(zip(nodes, answers, strict=True))
        values = np.zeros(episodes)
        for p, hands in paths:
            values += p * np.array(_play(policy, hands, loss))
        score = float(np.dot(weights, values))
        if score > best + 1e-12:
            best, best_values = score, values
    return list(best_values)


def _brute_credit(population, episodes, weights_fn, loss) -> list[float]:
    """Each history's answer best-responds to the later ones' (ties fold), by paths."""
    paths = list(_paths(population, episodes))
    policy: dict[tuple[Obs, ...], str] = {}
    for k in range(episodes - 1, -1, -1):
        for history in itertools.product("-WS", repeat=k):
            reach = [(p, h) for p, h in paths if _consistent(history, h)]
            if not reach:
                policy[history] = "FOLD"
                continue
            scores = {}
            for answer in ("FOLD", "CALL"):
                policy[history] = answer
                mass = sum(p for p, _ in reach)
                tail = sum(p * np.array(_play(policy, h, loss, history)) for p, h in reach) / mass
                scores[answer] = float(np.dot(weights_fn(k, episodes), tail))
            policy[history] = "CALL" if scores["CALL"] > scores["FOLD"] + 1e-12 else "FOLD"
    values = np.zeros(episodes)
    for p, hands in paths:
        values += p * np.array(_play(policy, hands, loss))
    return list(values)


POPULATIONS = [
    TRAIN,
    SPEC_POP,
    {"showdown:bluffer:0.8": 1.0, "showdown:honest": 1.0},
    {"showdown:bluffer": 1.0, "showdown:bluffer:0.4": 2.0, "showdown:honest": 1.0},
]


@pytest.mark.parametrize("episodes", [2, 3])
@pytest.mark.parametrize("population", POPULATIONS)
@pytest.mark.parametrize("loss", [1.0, 1.5])
def test_exact_values_match_brute_force(population, episodes, loss) -> None:
    values = showdown_values(population, episodes, loss=loss, gamma_traj=1.0)
    for objective in OBJECTIVES:
        brute = _brute_objective(population, episodes, objective, loss)
        plan = values.objectives[objective]
        weights = objective_weights(objective)(0, episodes)
        assert np.dot(weights, plan.episode_values) == pytest.approx(
            np.dot(weights, brute), abs=1e-9
        )
    for mode in CREDIT_MODES:
        for gamma in (1.0, 0.6):
            fn = credit_weights(mode, gamma)
            plan = showdown_values(population, episodes, loss=loss, gamma_traj=gamma).credit[mode]
            assert plan.episode_values == pytest.approx(
                _brute_credit(population, episodes, fn, loss), abs=1e-9
            ), (mode, gamma)


def test_oracle_command_prints_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mage_rl.cli", "oracle", "showdown", "--json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    data = json.loads(out.stdout)
    assert data["episodes"] == 2 and data["credit"]["differential"]["first_answer"] == "CALL"
    assert data["objectives"]["greedy"]["first_answer"] == "FOLD"
    bad = subprocess.run(
        [sys.executable, "-m", "mage_rl.cli", "oracle", "showdown", "--population", "showdown:bluffer:2"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode != 0 and "bluff rate" in bad.stderr
