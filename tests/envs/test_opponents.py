"""Opponent registry, spec strings and populations."""

from __future__ import annotations

from collections import Counter

import pytest

from mage_rl.envs import (
    POPULATION_PRESETS,
    Population,
    make_env,
    make_opponent,
    register_opponent,
    resolve_seat,
)


def test_unknown_opponent_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="kuhn_poker:aggressive"):
        make_opponent("kuhn:sneaky")
    with pytest.raises(ValueError, match="unknown environment .chess."):
        make_opponent("chess:stockfish")
    with pytest.raises(ValueError, match="ttt:mcts:N"):
        make_opponent("ttt:mcts:many")


def test_user_opponent_registration_and_use_in_population() -> None:
    def always_bet(state, player):
        return 1

    register_opponent("kuhn", "always_bet_test", always_bet)
    pop = Population.parse("always_bet_test=1,conservative=1", game="kuhn_poker")
    assert pop.specs == ["kuhn_poker:always_bet_test", "kuhn_poker:conservative"]
    env = make_env("kuhn", "kuhn:always_bet_test", seat=1)
    obs = env.reset(0)
    assert "opponent BET" in obs


def test_user_opponent_with_rng_and_illegal_action() -> None:
    def pick(state, player, rng):
        return int(rng.choice(state.legal_actions(player)))

    def illegal(state, player):
        return 99

    register_opponent("ttt", "rng_test", pick)
    register_opponent("ttt", "illegal_test", illegal)
    env = make_env("ttt", "ttt:rng_test", seat=1)
    assert env.reset(1) == env.reset(1)
    with pytest.raises(ValueError, match="not legal"):
        make_env("ttt", "ttt:illegal_test", seat=1).reset(0)


def test_population_sampling_is_seeded_and_weighted() -> None:
    pop = POPULATION_PRESETS["kuhn_train"]
    assert [pop.sample(s) for s in range(50)] == [pop.sample(s) for s in range(50)]
    counts = Counter(pop.sample(s) for s in range(4000))
    assert abs(counts["kuhn_poker:intermediate"] / 4000 - 0.4) < 0.03
    assert abs(counts["kuhn_poker:aggressive"] / 4000 - 0.3) < 0.03


def test_ttt_training_population_is_half_mcts() -> None:
    pop = POPULATION_PRESETS["ttt_train"]
    weights = dict(zip(pop.specs, pop.weights, strict=True))
    assert weights["tic_tac_toe:mcts:100"] == pytest.approx(0.5)
    assert sum(w for s, w in weights.items() if "pattern" in s or "random" in s) == pytest.approx(
        0.5
    )


def test_bad_population_weight_and_seat() -> None:
    with pytest.raises(ValueError, match="negative"):
        Population((("kuhn:aggressive", -1.0),))
    with pytest.raises(ValueError, match="unknown seat"):
        resolve_seat("middle", 0)
    assert {resolve_seat("sampled", s) for s in range(20)} == {0, 1}
    assert resolve_seat("second", 0) == 1


def test_bare_names_with_arguments_take_the_game_prefix() -> None:
    # "mcts:300" is an opponent of the game, not a game called "mcts".
    population = Population.parse("mcts:300=1,random=1", game="ttt")
    assert population.specs == ["tic_tac_toe:mcts:300", "tic_tac_toe:random"]
    assert Population.parse("kuhn:cfr=1", game="ttt").specs == ["kuhn_poker:cfr"]
