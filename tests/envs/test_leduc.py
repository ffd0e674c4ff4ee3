"""Leduc Hold'em through the text interface: rules, grammar, scoring, opponents."""

from __future__ import annotations

import pyspiel
import pytest

from mage_rl.envs import make_env, make_opponent
from mage_rl.envs.leduc import CALL, FOLD, RAISE, REWARD_PER_CHIP, contributions

GAME = pyspiel.load_game("leduc_poker")
# Card ids: 0-1 are J, 2-3 Q, 4-5 K.
J, Q, K = 0, 2, 4


def _seed_dealing(seat: int, mine: int, theirs: int) -> int:
    """A seed whose deal gives the agent rank ``mine`` and the opponent ``theirs``."""
    env = make_env("leduc", "leduc:calling_station", seat=seat)
    for seed in range(500):
        env.reset(seed)
        history = env.state.history()
        if history[seat] // 2 == mine // 2 and history[1 - seat] // 2 == theirs // 2:
            return seed
    raise AssertionError("no such deal in 500 seeds")


def test_scripted_hand_with_invalid_answers_that_change_nothing() -> None:
    seed = _seed_dealing(0, K, J)
    env = make_env("leduc", "leduc:calling_station", seat=0)
    first = env.reset(seed)
    assert "Your card: K." in first and "Legal actions: CHECK, RAISE." in first
    assert "Public card: not dealt yet" in first
    history = list(env.state.history())
    for answer, reason in [
        ("I raise", "no <action>"),
        ("<action>FOLD</action>", "nothing to call"),
        ("<action>BET 2</action>", "is not an action"),
        ("<action>raise!!?</action>", "is not an action"),
    ]:
        step = env.step(answer)
        assert step.info.invalid and reason in step.info.invalid_reason, answer
        assert list(env.state.history()) == history and not step.done
    step = env.step("<action>raise</action>")  # the calling station calls the raise
    assert not step.info.invalid and step.info.action == "RAISE"
    assert step.info.events == ["You: RAISE", "Opponent: CALL"]
    assert contributions(env.state) == (3, 3)
    assert "Public card:" in step.observation and "not dealt" not in step.observation
    step = env.step("<action>RAISE</action>")
    assert step.info.events == ["You: RAISE", "Opponent: CALL"]
    assert step.done and step.info.outcome in ("won", "lost")
    # K against J wins unless the J pairs the board: 7 chips each way in the pot.
    payoff = step.info.payoff
    assert payoff in (7.0, -7.0)
    assert step.reward == pytest.approx(REWARD_PER_CHIP * payoff)
    assert "Showdown: your K against the opponent's J" in step.info.feedback
    assert env.turns == 6


def test_check_when_facing_a_raise_is_invalid_and_call_is_a_check_when_nothing_is_owed() -> None:
    env = make_env("leduc", "leduc:loose_aggressive", seat=1)
    obs = env.reset(3)
    assert "Round 1 betting: opponent RAISE." in obs and "2 more chips to call" in obs
    assert env.legal_actions() == ["FOLD", "CALL", "RAISE"]
    step = env.step("<action>CHECK</action>")
    assert step.info.invalid and "cannot CHECK" in step.info.invalid_reason
    env2 = make_env("leduc", "leduc:tight_passive", seat=0)
    env2.reset(3)
    assert env2.legal_actions() == ["CHECK", "RAISE"]
    step = env2.step("<action>call</action>")
    assert not step.info.invalid and step.info.action == "CHECK"


def test_a_third_raise_is_refused_with_a_reason() -> None:
    env = make_env("leduc", "leduc:loose_aggressive", seat=0)
    env.reset(0)
    step = env.step("<action>RAISE</action>")
    assert step.info.events == ["You: RAISE", "Opponent: RAISE"]
    assert env.legal_actions() == ["FOLD", "CALL"]
    history = list(env.state.history())
    step = env.step("<action>RAISE</action>")
    assert step.info.invalid and "two raises" in step.info.invalid_reason
    assert list(env.state.history()) == history


def test_fold_ends_the_hand_without_showing_cards() -> None:
    env = make_env("leduc", "leduc:loose_aggressive", seat=1)
    env.reset(11)
    step = env.step("<action>FOLD</action>")
    assert step.done and step.info.outcome == "lost" and step.info.payoff == -1.0
    assert "You folded; no cards are shown." in step.info.feedback
    assert "opponent_card" not in step.info.extra
    assert env.brief_summary.endswith("opp RAISE, you FOLD, -1")


@pytest.mark.parametrize("seat", [0, 1])
def test_render_does_not_depend_on_the_opponents_card(seat: int) -> None:
    rules = make_env("leduc", "leduc:rock").rules
    for history in ([], [RAISE], [CALL, CALL, 5], [RAISE, CALL, 5, RAISE]):
        views = set()
        for theirs in (J, 3, K):  # J, Q, K; the agent holds the other Q
            deal = (2, theirs) if seat == 0 else (theirs, 2)
            state = GAME.new_initial_state()
            for a in (*deal, *history):
                state.apply_action(a)
            views.add((rules.render(state, seat), rules.brief_render(state, seat)))
        assert len(views) == 1, history
        assert "Your card: Q." in views.pop()[0]


# -- opponents ----------------------------------------------------------------------------


def _decision(name: str, deal: tuple[int, int], history: list[int]) -> int:
    state = GAME.new_initial_state()
    for a in (*deal, *history):
        state.apply_action(a)
    return make_opponent(f"leduc:{name}").act(state, state.current_player())


@pytest.mark.parametrize(
    ("name", "deal", "history", "expected"),
    [
        ("tight_passive", (J, Q), [], CALL),
        ("tight_passive", (J, Q), [RAISE], FOLD),  # Q facing a raise
        ("tight_passive", (J, K), [RAISE], CALL),  # K facing a raise
        ("tight_passive", (K, Q), [CALL, RAISE], CALL),  # player 0 holds K
        ("loose_aggressive", (J, Q), [], RAISE),
        ("loose_aggressive", (J, Q), [RAISE, RAISE], CALL),  # no raise left
        ("rock", (J, Q), [RAISE], CALL),  # Q before the public card
        ("rock", (J, Q), [CALL, RAISE], FOLD),  # J facing a raise
        ("rock", (J, Q), [CALL, CALL, 3, CALL], RAISE),  # Q pairs the public Q
        ("rock", (J, Q), [CALL, CALL, 1, CALL], CALL),  # no pair: check
        ("calling_station", (J, Q), [RAISE], CALL),
    ],
)
def test_archetype_decisions(name: str, deal, history, expected: int) -> None:
    assert _decision(name, deal, history) == expected


def test_random_opponent_is_seeded() -> None:
    runs = []
    for _ in range(2):
        env = make_env("leduc", "leduc:random", seat=0)
        runs.append([env.reset(seed) for seed in range(20)])
    assert runs[0] == runs[1]
