"""TextWorld-Express through the text interface: scripted valid, invalid and winning
answers on the real simulator (one JVM for the module), the protocols and the graph."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import BaseMessage

from mage_rl.envs import episode_seed, make_env
from mage_rl.envs.twx import TextWorldExpressEnv
from mage_rl.graphs import GraphOptions, mage_graph

pytest.importorskip("textworld_express")


class ScriptedChat(FakeListChatModel):
    """Play turns from ``responses`` in order, reflect turns from ``reflections``."""

    reflections: list[str] = []

    def _call(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> str:
        if "<remark>" in messages[-1].content:
            return self.reflections[0]
        return super()._call(messages, *args, **kwargs)


@pytest.fixture(scope="module")
def shared() -> TextWorldExpressEnv:
    env = make_env("twx", "twx:coin:train:small", max_turns=12)
    assert isinstance(env, TextWorldExpressEnv)
    return env


@pytest.fixture
def env(shared: TextWorldExpressEnv) -> Iterator[TextWorldExpressEnv]:
    """The module's environment; its simulator goes back to the pool after each test, so
    the whole module runs on one JVM."""
    yield shared
    shared.close()


def act(action: str) -> str:
    return f"Thought: next.\n<action>{action}</action>"


def test_gold_path_wins_with_plus_ten(env: TextWorldExpressEnv) -> None:
    obs = env.reset(7)
    assert env.goal.startswith("Your task is to search the environment and find the coin")
    assert "Valid actions:" in obs and "look around" in env.legal_actions()
    gold = env.gold_actions()
    assert gold and gold[-1] == "take coin"
    for i, action in enumerate(gold):
        assert action in env.legal_actions()  # the listed actions are complete
        result = env.step(act(action.upper() + "."))  # case and a full stop do not matter
        assert not result.info.invalid
        if i < len(gold) - 1:
            assert not result.done and result.reward == 0.0
    assert result.done and result.reward == 10.0 and result.info.outcome == "won"
    assert result.info.extra["score"] == 1.0 and result.info.extra["task"] == "coin"
    assert "Task done" in result.info.feedback
    assert env.transcript[-1] == "take coin -> You take the coin."
    assert env.legal_actions() == []
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(act("look around"))


def test_invalid_answers_leave_the_world_and_count_the_turn(env: TextWorldExpressEnv) -> None:
    obs = env.reset(7)
    for response, reason in [
        ("I will look around", "no <action>"),
        (act("   "), "the action is empty"),
        (act("fly to the moon"), "not one of the valid actions"),
        (act("look arround"), "did you mean 'look around'"),
    ]:
        result = env.step(response)
        assert result.info.invalid and reason in result.info.invalid_reason
        assert result.observation == obs and result.reward == 0.0 and not result.done
        assert result.info.events == []
    assert env.turns == 4 and env.transcript == []
    result = env.step(act("look around"))
    assert not result.info.invalid and env.turns == 5


def test_running_out_of_turns_is_unfinished_and_frees_the_simulator(
    env: TextWorldExpressEnv,
) -> None:
    short = make_env("twx", "twx:coin:train:small", max_turns=2)
    short.reset(7)
    assert short.step(act("inventory")).done is False
    result = short.step(act("nonsense"))
    assert result.done and result.info.outcome == "unfinished" and result.reward == 0.0
    assert "Out of turns (2)" in result.info.feedback
    assert short._sim is None  # handed back to the pool for the next episode


def test_seeds_fix_the_world_and_splits_keep_their_seeds(env: TextWorldExpressEnv) -> None:
    first = env.reset(123)
    variation = env.variation
    assert env.reset(123) == first and env.variation == variation
    assert 0 <= variation < 1000  # a train seed
    test_env = make_env("twx", "twx:coin:test:small")
    test_env.reset(123)
    assert 20000 <= test_env.variation < 21000  # a test seed: never seen in training
    test_env.close()
    # replay: every episode of a meta-episode the same world; fresh: new worlds.
    replay = {episode_seed(5, k, "replay") for k in range(3)}
    assert len(replay) == 1
    worlds = set()
    for k in range(3):
        env.reset(episode_seed(5, k, "fresh"))
        worlds.add(env.variation)
    assert len(worlds) == 3


def test_brief_views_are_short(env: TextWorldExpressEnv) -> None:
    full = env.reset(7)
    brief = env.brief_observation
    assert "Actions:" in brief and len(brief) < len(full)
    assert env.brief_description.endswith("12 turns.") and len(env.brief_description) < 200
    env.step(act("look around"))
    assert env.brief_summary.startswith("coin #") and "1 actions" in env.brief_summary


def test_meta_episode_graph_learns_the_world_across_episodes(env: TextWorldExpressEnv) -> None:
    game = make_env("twx", "twx:coin:train:small", max_turns=3)
    task_seed = 11
    game.reset(episode_seed(task_seed, 0, "replay"))
    gold = game.gold_actions()
    game.close()
    # Episode 1 wastes its 3 turns; the reflection remembers; episode 2 follows the path.
    game = make_env("twx", "twx:coin:train:small", max_turns=len(gold))
    llm = ScriptedChat(
        responses=[act("fly")] * len(gold) + [act(a) for a in gold],
        reflections=["<remark>the coin is in another room</remark>"],
    )
    graph = mage_graph(GraphOptions(num_episodes=3))
    state = asyncio.run(
        graph.run(game, llm, task_seed=task_seed, opponent="textworld_express:coin:train:small")
    )
    assert [e["outcome"] for e in state["episodes"]] == ["unfinished", "won"]
    plays = [t for t in state["turns"] if t["kind"] == "play"]
    system = plays[-1]["prompt_text"][0]["content"]
    assert "TextWorld-Express" in system and "opponent" not in system
    assert "the coin is in another room" in plays[-1]["prompt_text"][-1]["content"]
