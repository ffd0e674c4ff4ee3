"""Random answers against Leduc and Liar's Dice; registration and presets of both."""

from __future__ import annotations

import random

import pytest

from mage_rl.envs import POPULATION_PRESETS, canonical_game, env_spec, make_env
from mage_rl.eval.conditions import opponent_population

WORDS = ["FOLD", "CHECK", "CALL", "RAISE", "LIAR", "liar", "bet", "pass", "", " ", "1-", "-3"]


def _answer(rng: random.Random, legal: list[str]) -> str:
    kind = rng.randrange(6)
    if kind == 0 and legal:
        body = rng.choice(legal)
    elif kind == 1:
        body = rng.choice(WORDS)
    elif kind == 2:
        body = f"{rng.randint(-2, 12)}-{rng.randint(-1, 9)}"
    elif kind == 3:
        body = "".join(rng.choice("0123456789-LIARaisecl .!\n") for _ in range(rng.randint(0, 8)))
    elif kind == 4:
        return "".join(rng.choice("<>/action RAISE 2-5") for _ in range(rng.randint(0, 30)))
    else:
        body = rng.choice(legal or WORDS).lower() + rng.choice(["", ".", "!", " ", "  x"])
    return f"thinking... <action>{body}</action>"


@pytest.mark.parametrize(
    ("game", "opponents"),
    [
        ("leduc", ["leduc:tight_passive", "leduc:loose_aggressive", "leduc:rock", "leduc:random"]),
        ("liars", ["liars:truthful", "liars:bluffer", "liars:caller", "liars:statistician"]),
    ],
)
def test_random_answers_never_raise_and_invalid_ones_change_nothing(game, opponents) -> None:
    rng = random.Random(0)
    steps = invalid = valid = 0
    for seat in (0, 1):
        for opponent in opponents:
            env = make_env(game, opponent, seat=seat)
            env.reset(rng.randrange(10**6))
            for _ in range(400):
                before = list(env.state.history())
                step = env.step(_answer(rng, env.legal_actions()))
                steps += 1
                if step.info.invalid:
                    invalid += 1
                    assert step.info.invalid_reason
                    assert list(env.state.history()) == before
                else:
                    valid += 1
                    assert step.info.events[0] == f"You: {step.info.action}"
                if step.done:
                    assert step.info.outcome in ("won", "lost", "draw", "unfinished")
                    env.reset(rng.randrange(10**6))
    assert steps >= 3000 and valid > 300 and invalid > 1000


@pytest.mark.parametrize(
    ("alias", "name", "short"),
    [("leduc", "leduc_poker", "leduc"), ("liars", "liars_dice", "liars_dice")],
)
def test_registered_with_aliases_penalties_and_presets(alias: str, name: str, short: str) -> None:
    assert canonical_game(alias) == name
    spec = env_spec(alias)
    assert (spec.seats, spec.invalid_penalty, spec.length_penalty, spec.gamma_traj) == (
        2,
        0.5,
        2.0,
        0.6,
    )
    train = opponent_population("train", name)
    unseen = opponent_population("unseen", name)
    assert train is POPULATION_PRESETS[f"{short}_train"]
    assert unseen is POPULATION_PRESETS[f"{short}_unseen"]
    assert not set(train.specs) & set(unseen.specs)
    assert abs(sum(train.weights) - 1) < 1e-12


def test_leduc_cfr_opponent_plays_the_cached_solution(session_cache) -> None:
    env = make_env("leduc", "leduc:cfr:20", seat=0)
    env.reset(1)
    step = env.step("<action>CHECK</action>")  # the opponent moves next, or the hand ends
    assert not step.info.invalid
    assert (session_cache / "cfr_plus_leduc_poker_20.json").exists()
