"""ScienceWorld through the text interface: scripted valid, invalid, failing and winning
answers on the real simulator (one JVM for the module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mage_rl.envs import make_env
from mage_rl.envs.sciworld import ScienceWorldEnv

pytest.importorskip("scienceworld")

SPEC = "scienceworld:find-living-thing:train"
SEED = 1  # a variation that starts in the greenhouse, whose two doors make "door" ambiguous


@pytest.fixture(scope="module")
def shared() -> ScienceWorldEnv:
    env = make_env("sciworld", SPEC, max_turns=20)
    assert isinstance(env, ScienceWorldEnv)
    return env


@pytest.fixture
def env(shared: ScienceWorldEnv) -> Iterator[ScienceWorldEnv]:
    """The module's environment; its simulator goes back to the pool after each test."""
    yield shared
    shared.close()


def act(action: str) -> str:
    return f"<action>{action}</action>"


def test_gold_path_wins_with_plus_ten(env: ScienceWorldEnv) -> None:
    obs = env.reset(SEED)
    assert "greenhouse" in obs.splitlines()[0] and "Score so far: 0 of 100." in obs
    assert env.goal.startswith("Your task is to find a(n) living thing")
    assert "go to LOC" in env.legal_actions() and "reset task" not in env.legal_actions()
    assert "focus on OBJ" in env.task_description and env.goal in env.task_description
    gold = env.gold_actions()
    assert 4 <= len(gold) <= 12
    for i, action in enumerate(gold):
        result = env.step(act(action))
        assert not result.info.invalid, result.info.invalid_reason
        if i < len(gold) - 1:
            assert not result.done and result.reward == 0.0
    assert result.done and result.reward == 10.0 and result.info.outcome == "won"
    assert result.info.extra["score"] == 100 and result.info.extra["task"] == "find-living-thing"
    assert len(env.transcript) == len(gold)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(act("look around"))


def test_invalid_answers_leave_the_world_and_count_the_turn(env: ScienceWorldEnv) -> None:
    obs = env.reset(SEED)
    for response, reason in [
        ("look around", "no <action>"),
        (act("fly to the moon"), "the game did not understand 'fly to the moon'"),
        (act("reset task"), "'reset task' is not allowed"),
        (act("x" * 300), "300 characters long"),
    ]:
        result = env.step(response)
        assert result.info.invalid and reason in result.info.invalid_reason
        assert result.observation == obs and result.reward == 0.0 and not result.done
    assert env.turns == 4 and env.transcript == []


def test_an_ambiguous_command_takes_the_alphabetically_first_reading(env: ScienceWorldEnv) -> None:
    env.reset(SEED)
    result = env.step(act("look at door"))
    assert not result.info.invalid
    assert result.info.action == "look at door between greenhouse and hallway"
    assert env.transcript[0].startswith("look at door (taken as: look at door between")


def test_focusing_on_the_wrong_thing_is_a_loss(env: ScienceWorldEnv) -> None:
    env.reset(SEED)
    result = env.step(act("focus on air"))
    assert result.done and result.info.outcome == "lost" and result.reward == -10.0
    assert result.info.extra["score"] < 0 and "Task failed" in result.info.feedback


def test_replay_restarts_the_same_variation(env: ScienceWorldEnv) -> None:
    first = env.reset(SEED)
    variation = env.variation
    env.step(act("open door to outside"))
    assert env.reset(SEED) == first and env.variation == variation
    # The score is shown, never rewarded: a correct partial step pays 0.
    result = env.step(act("open door to outside"))
    assert result.reward == 0.0


def test_brief_views_are_short(env: ScienceWorldEnv) -> None:
    full = env.reset(SEED)
    brief = env.brief_observation
    assert brief.startswith("In the greenhouse:") and "Score 0/100." in brief
    assert "the agent" not in brief and len(brief) < len(full)
    assert len(env.brief_description) < len(env.task_description) / 2


ODD_ANSWERS = [
    "<action>look\ud800 around</action>",  # a lone surrogate: py4j cannot even send it
    "<action>look\x00around</action>",
    "<action>\u202elook around</action>",
    "<action>l\u043eok around</action>",  # Cyrillic o
    "<action>look around\nopen door to kitchen</action>",
    "<action>" * 2000,
    "<think><action>look around</action>",
    "<action>0</action>",  # answers an ambiguity prompt that was never asked
    "<action>" + "a" * 150 + "</action>",
]


def test_odd_answers_never_crash_or_change_the_world(env: ScienceWorldEnv) -> None:
    obs = env.reset(SEED)
    for answer in ODD_ANSWERS:
        result = env.step(answer)
        assert result.info.invalid and result.info.invalid_reason, repr(answer[:40])
        assert result.observation == obs
    assert env.step(act("look around")).info.invalid is False  # the simulator still answers
