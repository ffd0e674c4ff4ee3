"""A trained agent inside the user's own LangGraph: ``load_agent(RUN).as_graph()`` as a
node of a parent graph, on the local engine and through an endpoint (issue #41)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph

import mage_rl
from mage_rl.envs import make_env
from mage_rl.records import MetaEpisodeRecord

# Every meta-episode plays its K = 3 episodes; short answers keep it fast.
PLAY = ["meta.stop_on_success=false", "policy.max_tokens=8"]


class Match(TypedDict, total=False):
    """The user's graph: its own keys, and the agent's."""

    opponent_name: str
    env: Any
    task_seed: int
    episodes: list[dict[str, Any]]
    reflections: list[str]
    record: dict[str, Any]
    rewards: list[float]


def set_up(state: Match) -> dict[str, Any]:
    return {"env": make_env("kuhn", state["opponent_name"], seat=1), "task_seed": 5}


def score(state: Match) -> dict[str, Any]:
    return {"rewards": [e["reward"] for e in state["episodes"]]}


def match_graph(agent: mage_rl.TrainedAgent, checkpointer: Any = None) -> Any:
    builder = StateGraph(Match)
    builder.add_node("set_up", set_up)
    builder.add_node("agent", agent.as_graph())
    builder.add_node("score", score)
    builder.add_edge(START, "set_up")
    builder.add_edge("set_up", "agent")
    builder.add_edge("agent", "score")
    builder.add_edge("score", END)
    return builder.compile(checkpointer=checkpointer)


def check_match(out: dict[str, Any], agent: mage_rl.TrainedAgent) -> None:
    record = MetaEpisodeRecord.from_dict(out["record"])
    assert [e["index"] for e in out["episodes"]] == [0, 1, 2]
    assert out["rewards"] == record.episode_rewards == [e["reward"] for e in out["episodes"]]
    assert out["reflections"] == record.reflections
    assert (record.env, record.opponent, record.seat, record.seed) == (
        "kuhn_poker", "kuhn_poker:aggressive", 1, 5,
    )  # fmt: skip
    assert record.agent == agent.name and record.turns
    assert sum(t.kind == "play" for t in record.turns) == sum(e.turns for e in record.episodes)


def test_the_agent_plays_a_meta_episode_as_a_node_of_the_users_graph(kuhn_tiny_run: Path) -> None:
    with mage_rl.load_agent(kuhn_tiny_run, PLAY) as agent:
        sub = agent.as_graph()
        assert sub.name == kuhn_tiny_run.name == agent.name
        graph = match_graph(agent)
        check_match(graph.invoke({"opponent_name": "kuhn:aggressive"}), agent)
        check_match(asyncio.run(graph.ainvoke({"opponent_name": "kuhn:aggressive"})), agent)
        # A checkpointer stores the state, the environment object with it: by pickle.
        saver = InMemorySaver(serde=JsonPlusSerializer(pickle_fallback=True))
        thread = {"configurable": {"thread_id": "match-1"}}
        kept = match_graph(agent, saver).invoke({"opponent_name": "kuhn:aggressive"}, thread)
        check_match(kept, agent)
        # Alone, with the defaults: task seed 0, the environment's opponent.
        env = make_env("kuhn", "kuhn:aggressive", seat=0)
        alone = MetaEpisodeRecord.from_dict(sub.invoke({"env": env})["record"])
        assert (alone.seed, alone.opponent, len(alone.episodes)) == (0, "kuhn_poker:aggressive", 3)
        with pytest.raises(ValueError, match="needs 'env' in its input"):
            sub.invoke({"task_seed": 1})

        async def in_a_notebook_cell() -> MetaEpisodeRecord:
            return agent.play(seed=2)  # a sync call inside a running event loop

        assert len(asyncio.run(in_a_notebook_cell()).episodes) == 3


def test_the_agent_plays_through_an_endpoint(kuhn_tiny_run: Path) -> None:
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra is not installed")
    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model
    from mage_rl.serve import create_app, serve_in_thread
    from mage_rl.train_folder import find_run

    found = find_run(str(kuhn_tiny_run))
    assert found is not None
    model, tokenizer = load_model(str(found[1]), dtype="fp32")
    with (
        LocalEngine(model, tokenizer, name="trained") as engine,
        serve_in_thread(create_app(engine, "trained")) as url,
        mage_rl.load_agent(kuhn_tiny_run, PLAY, endpoint=url, endpoint_model="trained") as agent,
    ):
        assert agent.engine.base_url == url
        check_match(match_graph(agent).invoke({"opponent_name": "kuhn:aggressive"}), agent)
        assert agent.play(seed=5, opponent="kuhn_poker:aggressive", seat="second").turns


def test_an_endpoint_needs_its_model_name_and_a_setting_it_can_serve(
    kuhn_tiny_run: Path,
) -> None:
    url = "http://127.0.0.1:9/v1"  # never reached
    with pytest.raises(ValueError, match="needs endpoint_model=NAME"):
        mage_rl.load_agent(kuhn_tiny_run, endpoint=url)
    with pytest.raises(ValueError, match="constrain_actions=True.*without endpoint="):
        mage_rl.load_agent(
            kuhn_tiny_run, ["policy.constrain_actions=true"], endpoint=url, endpoint_model="m"
        )
