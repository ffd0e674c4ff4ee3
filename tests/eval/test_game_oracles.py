"""Oracle values of Leduc Hold'em and Liar's Dice against independent computations.

The independent side writes each opponent down again here, as a function of OpenSpiel's
information-state string (not through the opponent classes), and evaluates it with
OpenSpiel's Python ``BestResponsePolicy`` and ``expected_game_score`` (the oracle uses
the C++ ``TabularBestResponse`` and its own opponent tables).
"""

from __future__ import annotations

import json
import re

import pyspiel
import pytest
from open_spiel.python import policy as os_policy
from open_spiel.python.algorithms import best_response, expected_game_score

from mage_rl.cli import main
from mage_rl.envs import POPULATION_PRESETS
from mage_rl.eval.game_oracles import (
    best_response_value,
    game_oracle,
    nash_bounds,
    opponent_table,
)
from mage_rl.eval.oracles import kuhn_oracle

LEDUC = pyspiel.load_game("leduc_poker")
LIARS = pyspiel.load_game("liars_dice")
FOLD, CALL, RAISE = 0, 1, 2
LEDUC_NASH_FIRST = -0.085606  # the first player's equilibrium value, as published


class WrittenPolicy(os_policy.Policy):
    """A deterministic strategy for one player given as ``decide(info_state, legal)``."""

    def __init__(self, game: pyspiel.Game, player: int, decide) -> None:
        super().__init__(game, [player])
        self.decide = decide

    def action_probabilities(self, state, player_id=None):
        legal = state.legal_actions()
        pick = self.decide(state.information_state_string(), legal)
        return {a: float(a == pick) for a in legal}


def _leduc_fields(info: str) -> tuple[int, int | None, bool]:
    private = int(re.search(r"\[Private: (\d)\]", info).group(1)) // 2
    public = re.search(r"\[Public: (\d)\]", info)
    money = re.search(r"\[Money: (\d+) (\d+)\]", info)
    return private, None if public is None else int(public.group(1)) // 2, money[1] != money[2]


def leduc_tight_passive(info: str, legal: list[int]) -> int:
    rank, public, facing = _leduc_fields(info)
    if not facing:
        return CALL
    return CALL if rank == 2 or rank == public else FOLD


def leduc_calling_station(info: str, legal: list[int]) -> int:
    return CALL


def leduc_loose_aggressive(info: str, legal: list[int]) -> int:
    return RAISE if RAISE in legal else CALL


def liars_caller(info: str, legal: list[int]) -> int:
    die, *bids = info.split()
    return int(die) - 1 if not bids else 12  # open "1-own face", then LIAR


def _independent_br(game, decide, opponent_seat: int) -> float:
    pol = WrittenPolicy(game, opponent_seat, decide)
    br = best_response.BestResponsePolicy(game, 1 - opponent_seat, pol)
    return float(br.value(game.new_initial_state()))


def test_the_generic_oracle_reproduces_kuhn() -> None:
    population = POPULATION_PRESETS["kuhn_train"]
    kuhn = kuhn_oracle(population)
    generic = game_oracle("kuhn", population, nash_iterations=50)
    for a, b in zip(kuhn.seats, generic.seats, strict=True):
        assert b.best_response == pytest.approx(a.best_response, abs=1e-12)
        assert (b.best_fixed, b.ceiling) == pytest.approx((a.best_fixed, a.ceiling), abs=1e-12)
        assert b.nash_low <= a.nash <= b.nash_high


def test_leduc_nash_bounds_hold_the_published_value_and_tighten() -> None:
    loose = nash_bounds("leduc_poker", 10)
    tight = nash_bounds("leduc_poker", 100)
    for low, high in (loose, tight):
        assert low <= LEDUC_NASH_FIRST <= high
    assert tight[1] - tight[0] < loose[1] - loose[0]
    assert tight[1] - tight[0] < 0.05


@pytest.mark.parametrize(
    ("spec", "decide"),
    [
        ("leduc:tight_passive", leduc_tight_passive),
        ("leduc:calling_station", leduc_calling_station),
        ("leduc:loose_aggressive", leduc_loose_aggressive),
    ],
)
@pytest.mark.parametrize("agent_seat", [0, 1])
def test_leduc_best_response_matches_openspiel_on_a_written_strategy(
    spec: str, decide, agent_seat: int
) -> None:
    table = opponent_table("leduc_poker", spec, 1 - agent_seat)
    ours = best_response_value("leduc_poker", table, agent_seat)
    assert ours == pytest.approx(_independent_br(LEDUC, decide, 1 - agent_seat), abs=1e-9)


def test_leduc_population_values_against_evaluated_best_responses() -> None:
    population = {
        "leduc:tight_passive": 0.5,
        "leduc:calling_station": 0.3,
        "leduc:loose_aggressive": 0.2,
    }
    written = [leduc_tight_passive, leduc_calling_station, leduc_loose_aggressive]
    weights = list(population.values())
    oracle = game_oracle("leduc", population, nash_iterations=20)
    first = oracle.seats[0]
    opponents = [WrittenPolicy(LEDUC, 1, d) for d in written]
    responses = [best_response.BestResponsePolicy(LEDUC, 0, p) for p in opponents]
    # The ceiling is the weighted best responses; no single best response to one
    # opponent beats the best fixed strategy against the whole population.
    brs = [r.value(LEDUC.new_initial_state()) for r in responses]
    assert first.ceiling == pytest.approx(
        sum(w * v for w, v in zip(weights, brs, strict=True)), abs=1e-9
    )
    for response in responses:
        against = [
            expected_game_score.policy_value(LEDUC.new_initial_state(), [response, p])[0]
            for p in opponents
        ]
        value = sum(w * v for w, v in zip(weights, against, strict=True))
        assert value <= first.best_fixed + 1e-9
    assert max(brs) >= first.ceiling >= first.best_fixed
    assert first.best_fixed > first.nash_high  # these archetypes are exploitable


def test_leduc_random_opponent_is_openspiels_uniform_policy() -> None:
    table = opponent_table("leduc_poker", "leduc:random", 1)
    uniform = os_policy.UniformRandomPolicy(LEDUC)
    br = best_response.BestResponsePolicy(LEDUC, 0, uniform).value(LEDUC.new_initial_state())
    assert best_response_value("leduc_poker", table, 0) == pytest.approx(br, abs=1e-9)


def test_liars_dice_best_response_to_the_caller_by_hand() -> None:
    # The caller opens with one of its own face c and calls LIAR on any bid. Second
    # seat with die d: a true raise exists unless 1 <= d < c <= 5 (10 of 36 rolls), and
    # the caller then calls and loses; so the value is (26 - 10) / 36 = 4/9.
    table = opponent_table("liars_dice", "liars:caller", 0)
    assert best_response_value("liars_dice", table, 1) == pytest.approx(4 / 9, abs=1e-12)


@pytest.mark.slow
def test_liars_dice_oracle_against_openspiel() -> None:
    oracle = game_oracle("liars", POPULATION_PRESETS["liars_dice_train"], nash_iterations=50)
    first, second = oracle.seats
    assert first.best_response["liars_dice:caller"] == pytest.approx(1.0)  # any true bid
    assert second.best_response["liars_dice:caller"] == pytest.approx(4 / 9)
    assert second.best_response["liars_dice:caller"] == pytest.approx(
        _independent_br(LIARS, liars_caller, 0), abs=1e-9
    )
    for seat in (first, second):
        assert seat.nash_low <= seat.nash <= seat.nash_high
        assert seat.nash_high <= seat.best_fixed + 1e-9 <= seat.ceiling + 2e-9


def test_cli_oracle_leduc_json_and_table(capsys) -> None:
    args = ["oracle", "leduc", "--population", "calling_station", "--nash-iterations", "20"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["game"] == "leduc_poker" and data["payoff_unit"] == "chips per hand"
    station = _independent_br(LEDUC, leduc_calling_station, 1)
    assert data["seats"][0]["best_response"]["leduc_poker:calling_station"] == pytest.approx(
        station
    )
    assert data["seats"][0]["best_fixed"] == pytest.approx(station)
    assert main(args) == 0
    assert f"{station:.4f}" in capsys.readouterr().out


def test_cli_oracle_refuses_a_bad_iteration_count() -> None:
    with pytest.raises(SystemExit, match="nash-iterations"):
        main(["oracle", "leduc", "--nash-iterations", "0"])
