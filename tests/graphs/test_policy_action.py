"""The action of a policy graph: its ``action`` key or the model's reply, never the prompt.

A graph on ``MessagesState`` that forgets to append the model's reply returns the play
prompt's own user message last; sending that text to the environment played a whole run
of invalid moves with exit code 0 (issue #41), so it is an error naming the graph.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from mage_rl.envs import make_env
from mage_rl.graphs import GraphOptions, build_meta_episode_graph
from mage_rl.graphs.policy import policy_action

PROMPT = [SystemMessage("You play Kuhn Poker."), HumanMessage("Answer <action>...</action>")]


def test_messages_ending_in_the_prompt_raise_with_the_graph_and_its_keys() -> None:
    with pytest.raises(ValueError) as error:
        policy_action({"messages": PROMPT, "plan": "bet"}, "planner")
    text = str(error.value)
    assert "'planner'" in text and "['messages', 'plan']" in text
    assert "ending in a HumanMessage" in text
    assert "'action: str'" in text and "append the model's reply to 'messages'" in text
    with pytest.raises(ValueError, match="'planner' returned no action.*got None"):
        policy_action(None, "planner")


def test_the_model_reply_or_the_action_key_is_the_action() -> None:
    reply = AIMessage("<action>BET</action>")
    assert policy_action({"messages": [*PROMPT, reply]}) == "<action>BET</action>"
    assert policy_action({"messages": PROMPT, "action": "<action>PASS</action>"}) == (
        "<action>PASS</action>"
    )
    # An empty action falls back to the reply.
    assert policy_action({"messages": [*PROMPT, reply], "action": ""}) == "<action>BET</action>"


def _messages_graph(*, append: bool) -> Any:
    """A policy on ``MessagesState`` that calls the model and appends its reply, or
    (the bug) calls it and forgets to."""

    async def think(state: MessagesState, runtime: Any) -> dict[str, Any]:
        reply = await runtime.context.llm.ainvoke(state["messages"])
        return {"messages": [reply]} if append else {}

    builder = StateGraph(MessagesState)
    builder.add_node("think", think)
    builder.add_edge(START, "think")
    builder.add_edge("think", END)
    return builder.compile(name="planner")


def _play(policy: Any) -> Any:
    graph = build_meta_episode_graph(
        GraphOptions(num_episodes=2, layout="rerendered"), policy=policy
    )
    llm = FakeListChatModel(responses=["<action>PASS</action>"])
    env = make_env("kuhn", "kuhn:aggressive", seat=0)
    return asyncio.run(graph.run(env, llm, task_seed=1, opponent="kuhn_poker:aggressive"))


def test_a_meta_episode_with_a_policy_that_forgets_its_reply_fails_instead_of_playing() -> None:
    with pytest.raises(ValueError, match=r"'planner' returned no action.*keys \['messages'\]"):
        _play(_messages_graph(append=False))


def test_a_meta_episode_with_a_policy_that_appends_its_reply_plays() -> None:
    state = _play(_messages_graph(append=True))
    assert len(state["episodes"]) == 2
    assert all(e["invalid_actions"] == 0 for e in state["episodes"])
