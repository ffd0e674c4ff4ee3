"""Fuzzed model answers: nothing a model writes can crash, stall or corrupt a game.

Each environment gets 10,000 generated answers of many kinds (legal moves, random
Unicode, homoglyphs, NUL bytes, direction marks, thousands of unclosed tags, think
blocks, very long strings). Every step must return, an invalid answer must leave the game
exactly as it was and say why, and no step may take 50 ms or more.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from mage_rl.envs import make_env
from mage_rl.envs.base import TextEnv

ANSWERS = 10_000
STEP_LIMIT_S = 0.05
TAGS = ("<action>", "</action>", "<ACTION>", "<think>", "</think>", "<remark>", "</remark>")
ODD = (
    "\x00",
    "\u202e",  # right-to-left override
    "\u200f",  # right-to-left mark
    "\u200b",  # zero-width space
    "\x0b",
    "\ufeff",
    "\ud800",  # a lone surrogate
    "ſ",  # long s: upper() makes it S
    "Ⅰ",  # roman numeral one
    "２",  # fullwidth digit
    "٢",  # Arabic-Indic digit
    "Ｂ",  # fullwidth letter
    "В",  # Cyrillic Ve, looks like B
    "Е",  # Cyrillic Ie, looks like E
    "Т",  # Cyrillic Te, looks like T
    "ｕ",  # fullwidth u
    "→",
    "\n",
    "\t",
)


def _random_unicode(rng: random.Random, n: int) -> str:
    return "".join(chr(rng.randrange(0x110000)) for _ in range(n))


def _answer(rng: random.Random, legal: list[str]) -> str:
    """One generated answer; about a quarter are legal moves, so games move on."""
    move = rng.choice(legal) if legal else "x"
    kind = rng.randrange(12)
    if kind <= 2:
        return f"<action>{move}</action>"
    if kind == 3:  # a legal move with a homoglyph or odd character spliced in
        i = rng.randrange(len(move) + 1)
        return f"<action>{move[:i]}{rng.choice(ODD)}{move[i:]}</action>"
    if kind == 4:
        return f"<action>{_random_unicode(rng, rng.randrange(1, 40))}</action>"
    if kind == 5:
        return _random_unicode(rng, rng.randrange(0, 200))
    if kind == 6:  # many unclosed or repeated tags (quadratic for a naive regex)
        return rng.choice(TAGS) * rng.randrange(100, 3000) + rng.choice(["", move])
    if kind == 7:  # nested, unterminated and thinking tags around the move
        parts = [rng.choice((*TAGS, move, " ", "I bet", "(1, 1)")) for _ in range(20)]
        return "".join(parts)
    if kind == 8:
        return f"<think>{move} <action>{move}</action>" + rng.choice(["", "</think>"])
    if kind == 9:  # a run of odd characters
        return "<action>" + "".join(rng.choice(ODD) for _ in range(rng.randrange(1, 30)))
    if kind == 10:  # a very long answer, now and then longer than the read limit
        size = rng.choice([5_000, 50_000, 150_000]) if rng.random() < 0.02 else 500
        return rng.choice("ab<>/ \n") * size + f"<action>{move}</action>"
    return f"<action>{move.lower()}{rng.choice(['', '.', '!', ' ', ')', ';'])}</action>"


def _kuhn() -> TextEnv:
    return make_env("kuhn", "kuhn:intermediate", seat=0, max_turns=6)


def _ttt() -> TextEnv:
    return make_env("ttt", "ttt:random", seat=0, max_turns=12)


def _sokoban() -> TextEnv:
    return make_env("sokoban", "sokoban:boxes:2", seat=0)


def _snapshot(env: TextEnv) -> object:
    """What the game is: positions and moves, not the turn counter (invalid turns count)."""
    if hasattr(env, "room"):
        return (env.room, env.moves_made, tuple(env.transcript))  # type: ignore[attr-defined]
    return (tuple(env.state.history()), tuple(env.transcript))  # type: ignore[attr-defined]


@pytest.mark.parametrize("build", [_kuhn, _ttt, _sokoban], ids=["kuhn", "ttt", "sokoban"])
def test_fuzzed_answers_never_crash_stall_or_change_the_game(
    build: Callable[[], TextEnv],
) -> None:
    rng = random.Random(2027)
    env = build()
    seed = 0
    env.reset(seed)
    slow: list[str] = []
    invalid = 0
    for _ in range(ANSWERS):
        answer = _answer(rng, env.legal_actions())
        before = _snapshot(env)
        start = time.perf_counter()
        result = env.step(answer)
        if time.perf_counter() - start >= STEP_LIMIT_S:
            slow.append(answer)
        if result.info.invalid:
            invalid += 1
            assert result.info.invalid_reason, answer[:80]
            assert _snapshot(env) == before, answer[:80]
        if result.done:
            seed += 1
            env.reset(seed)
    # A step over the limit is timed again on a fresh game: the work an answer costs
    # does not depend on the position, but a busy machine can pause any single step.
    for answer in slow:
        times = []
        for _ in range(3):
            fresh = build()
            fresh.reset(0)
            start = time.perf_counter()
            fresh.step(answer)
            times.append(time.perf_counter() - start)
        assert min(times) < STEP_LIMIT_S, (answer[:80], len(answer), times)
    assert ANSWERS * 0.4 < invalid < ANSWERS  # both paths were exercised
