"""Liar's Dice through the text interface: rules, grammar, scoring, opponents."""

from __future__ import annotations

import pyspiel
import pytest

from mage_rl.envs import make_env, make_opponent
from mage_rl.envs.liars_dice import LIAR, bid_action, chance_true, counts

GAME = pyspiel.load_game("liars_dice")


def _seed_rolling(seat: int, mine: int, theirs: int, opponent: str) -> int:
    env = make_env("liars", opponent, seat=seat)
    for seed in range(2000):
        env.reset(seed)
        history = env.state.history()
        if history[seat] + 1 == mine and history[1 - seat] + 1 == theirs:
            return seed
    raise AssertionError("no such roll")


def test_scripted_game_with_invalid_answers_that_change_nothing() -> None:
    seed = _seed_rolling(0, 4, 2, "liars:truthful")
    env = make_env("liars", "liars:truthful", seat=0)
    obs = env.reset(seed)
    assert "Your die: 4" in obs and "No bid yet" in obs and "LIAR" not in obs.split("Legal")[1]
    history = list(env.state.history())
    for answer, reason in [
        ("1-4", "no <action>"),
        ("<action>LIAR</action>", "no bid to call LIAR on"),
        ("<action>3-4</action>", "only 2 dice"),
        ("<action>1-7</action>", "faces 1 to 6"),
        ("<action>two fours</action>", "is not an action"),
        ("<action>1 - 4 - 2</action>", "is not an action"),
    ]:
        step = env.step(answer)
        assert step.info.invalid and reason in step.info.invalid_reason, answer
        assert list(env.state.history()) == history and not step.done
    # The truthful opponent holds a 2: no bid above 1-4 is sure for it, so it calls.
    step = env.step("<action>1-4</action>")
    assert step.info.events == ["You: 1-4", "Opponent: LIAR"]
    assert step.done and step.info.outcome == "won" and step.reward == 10.0
    assert step.info.payoff == 1.0  # the game's own payoff, the scale of its oracle
    assert "The opponent called LIAR on 1-4" in step.info.feedback
    assert "so the bid holds" in step.info.feedback
    assert step.info.extra == {"agent_die": 4, "opponent_die": 2, "bid": "1-4"}
    assert env.brief_summary == "die 4, you 1-4, opp LIAR, opp die 2, +1"


def test_a_bid_that_does_not_raise_is_invalid_and_liar_can_lose() -> None:
    seed = _seed_rolling(1, 3, 5, "liars:caller")
    env = make_env("liars", "liars:caller", seat=1)
    obs = env.reset(seed)
    assert "Bids so far: opponent 1-5." in obs and "at least one five" in obs
    step = env.step("<action>1-4</action>")
    assert step.info.invalid and "does not raise the current bid 1-5" in step.info.invalid_reason
    step = env.step("<action>liar</action>")  # 1-5 holds: the caller's own die is a 5
    assert step.done and step.info.outcome == "lost" and step.reward == -10.0
    assert step.info.payoff == -1.0
    assert "You called LIAR on 1-5" in step.info.feedback


def test_sixes_are_wild() -> None:
    assert counts(3, (6, 3)) == 2 and counts(6, (6, 3)) == 1 and counts(2, (6, 6)) == 2
    state = GAME.new_initial_state()
    for a in (0, 5, bid_action(2, 1), LIAR):  # dice 1 and 6; 2-1 holds
        state.apply_action(a)
    assert state.returns() == [1.0, -1.0]
    assert chance_true(bid_action(1, 3), 3) == 1.0
    assert chance_true(bid_action(2, 3), 3) == pytest.approx(2 / 6)
    assert chance_true(bid_action(2, 6), 3) == 0.0


@pytest.mark.parametrize("seat", [0, 1])
def test_render_does_not_depend_on_the_opponents_die(seat: int) -> None:
    rules = make_env("liars", "liars:caller").rules
    for bids in ([], [bid_action(1, 2)], [bid_action(1, 2), bid_action(2, 2)]):
        views = set()
        for theirs in range(6):
            deal = (3, theirs) if seat == 0 else (theirs, 3)
            state = GAME.new_initial_state()
            for a in (*deal, *bids):
                state.apply_action(a)
            if state.current_player() != seat:
                continue
            views.add((rules.render(state, seat), rules.brief_render(state, seat)))
        assert len(views) <= 1


def _decision(name: str, dice: tuple[int, int], bids: list[int]) -> int:
    state = GAME.new_initial_state()
    for a in (dice[0] - 1, dice[1] - 1, *bids):
        state.apply_action(a)
    return make_opponent(f"liars:{name}").act(state, state.current_player())


@pytest.mark.parametrize(
    ("name", "dice", "bids", "expected"),
    [
        ("truthful", (3, 1), [], bid_action(1, 3)),
        ("truthful", (6, 1), [bid_action(1, 2)], LIAR),  # player 1 holds a 1: nothing sure
        ("truthful", (1, 6), [bid_action(1, 2)], bid_action(1, 3)),  # a wild six
        ("bluffer", (4, 1), [], bid_action(2, 4)),
        ("bluffer", (1, 4), [bid_action(2, 5)], bid_action(2, 6)),
        ("bluffer", (1, 4), [bid_action(2, 6)], LIAR),  # no bid left
        ("caller", (2, 5), [], bid_action(1, 2)),
        ("caller", (2, 5), [bid_action(1, 1)], LIAR),
        ("statistician", (2, 5), [bid_action(2, 4)], LIAR),  # needs two: 0 chance
        ("statistician", (2, 5), [bid_action(1, 3)], bid_action(1, 5)),
    ],
)
def test_archetype_decisions(name: str, dice, bids, expected: int) -> None:
    assert _decision(name, dice, bids) == expected
