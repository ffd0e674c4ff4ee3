"""Exact Kuhn values of SPEC §9."""

from __future__ import annotations

import json

import pyspiel
import pytest
from open_spiel.python.algorithms import exploitability

from mage_rl.cli import main
from mage_rl.envs import POPULATION_PRESETS
from mage_rl.eval.oracles import (
    best_response_value,
    kuhn_oracle,
    nash_policy,
    nash_values,
    opponent_policy,
)


def test_nash_value_is_minus_one_eighteenth_and_unexploitable() -> None:
    first, second = nash_values()
    assert first == pytest.approx(-1 / 18, abs=1e-12)
    assert second == pytest.approx(1 / 18, abs=1e-12)
    assert exploitability.nash_conv(pyspiel.load_game("kuhn_poker"), nash_policy()) < 1e-12


@pytest.mark.parametrize(
    ("opponent", "first", "second"),
    [("conservative", 1 / 6, 1 / 3), ("aggressive", 1 / 3, 1 / 3), ("intermediate", 1 / 3, 1 / 6)],
)
def test_best_response_values(opponent: str, first: float, second: float) -> None:
    assert best_response_value(opponent_policy(f"kuhn:{opponent}", 1), 0) == pytest.approx(first)
    assert best_response_value(opponent_policy(f"kuhn:{opponent}", 0), 1) == pytest.approx(second)


def test_population_values() -> None:
    oracle = kuhn_oracle(POPULATION_PRESETS["kuhn_train"])
    first, second = oracle.seats
    assert first.best_fixed == pytest.approx(1 / 12)
    assert second.best_fixed == pytest.approx(1 / 6)
    assert first.ceiling == pytest.approx(0.2833, abs=1e-4)
    assert second.ceiling == pytest.approx(0.2667, abs=1e-4)
    assert first.replay_winnable == pytest.approx(0.617, abs=1e-3)
    assert second.replay_winnable == pytest.approx(0.55, abs=1e-3)


def test_best_fixed_against_a_single_opponent_is_its_best_response() -> None:
    oracle = kuhn_oracle({"kuhn:aggressive": 1.0})
    assert oracle.seats[0].best_fixed == pytest.approx(1 / 3)
    assert oracle.seats[0].ceiling == pytest.approx(1 / 3)


def test_cli_oracle_json(capsys) -> None:
    assert (
        main(
            [
                "oracle",
                "kuhn",
                "--population",
                "conservative=0.3,aggressive=0.3,intermediate=0.4",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert round(data["seats"][0]["best_fixed"], 4) == 0.0833
    assert round(data["seats"][1]["ceiling"], 4) == 0.2667
    assert round(data["seats"][0]["nash"], 4) == -0.0556


def test_cli_oracle_table(capsys) -> None:
    assert main(["oracle", "kuhn"]) == 0
    out = capsys.readouterr().out
    for value in ("0.0833", "0.1667", "0.2833", "0.2667", "0.6167", "0.5500", "-0.0556"):
        assert value in out


def test_cli_unknown_opponent_is_a_clear_error(capsys) -> None:
    assert main(["oracle", "kuhn", "--population", "sneaky=1"]) == 2
    assert "unknown opponent" in capsys.readouterr().out
