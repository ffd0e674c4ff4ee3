"""The meta-episode graph with scripted chat models (no LLM)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mage_rl.envs import make_env
from mage_rl.graphs import (
    GraphOptions,
    build_meta_episode_graph,
    mage_graph,
    react_graph,
    reflexion_graph,
)
from tests.graphs.conftest import ScriptedChat

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE_SNAPSHOTS = "MAGE_UPDATE_SNAPSHOTS"  # =1 rewrites the topology snapshots


def _run(graph, env, llm, seed=1, opponent="kuhn_poker:aggressive"):
    return asyncio.run(graph.run(env, llm, task_seed=seed, opponent=opponent))


def test_kuhn_meta_episode_plays_k_episodes_and_records_every_turn() -> None:
    llm = ScriptedChat(responses=["<action>PASS</action>"], reflections=["<remark>r</remark>"])
    graph = mage_graph(GraphOptions(num_episodes=3, stop_on_success=False))
    state = _run(graph, make_env("kuhn", "kuhn:aggressive", seat=0), llm)
    assert [e["index"] for e in state["episodes"]] == [0, 1, 2]
    kinds = [(t["kind"], t["episode"]) for t in state["turns"]]
    # PASS, the aggressive opponent bets, PASS again folds: two play turns per episode.
    assert kinds == [
        ("play", 0), ("play", 0), ("reflect", 1), ("play", 1), ("play", 1),
        ("reflect", 2), ("play", 2), ("play", 2),
    ]  # fmt: skip
    assert all(t["opponent"] == "kuhn_poker:aggressive" for t in state["turns"])
    assert state["turns"][2]["anchor"] == "reflection"
    assert state["turns"][0]["anchor"].startswith("Your card:")
    assert [t["reward"] for t in state["turns"] if t["kind"] == "play"] == [0, -5.0] * 3
    assert [t["step"] for t in state["turns"] if t["kind"] == "play"] == [0, 1] * 3


def test_reflection_of_episode_k_appears_in_play_prompts_of_episode_k_plus_1() -> None:
    llm = ScriptedChat(
        responses=["<action>PASS</action>"],
        reflections=["<remark>first lesson</remark>", "<remark>second lesson</remark>"],
    )
    graph = reflexion_graph(GraphOptions(num_episodes=3, stop_on_success=False))
    state = _run(graph, make_env("kuhn", "kuhn:aggressive", seat=0), llm)
    plays = [t for t in state["turns"] if t["kind"] == "play"]
    prompt = {t["episode"]: t["prompt_text"][-1]["content"] for t in plays}
    assert "first lesson" not in prompt[0]
    assert "first lesson" in prompt[1] and "second lesson" not in prompt[1]
    assert "first lesson" in prompt[2] and "second lesson" in prompt[2]
    assert state["memory"] == ["first lesson", "second lesson"]


def test_reflect_turn_without_remark_is_invalid_and_adds_no_memory() -> None:
    llm = ScriptedChat(responses=["<action>PASS</action>"], reflections=["just words"])
    graph = mage_graph(GraphOptions(num_episodes=2, stop_on_success=False))
    state = _run(graph, make_env("kuhn", "kuhn:aggressive", seat=0), llm)
    reflect = [t for t in state["turns"] if t["kind"] == "reflect"]
    assert len(reflect) == 1 and reflect[0]["invalid"]
    assert state["memory"] == []


def test_stop_on_success_ends_after_a_win() -> None:
    moves = ["<action>(1, 1)</action>", "<action>(2, 2)</action>", "<action>(3, 3)</action>"]
    env = make_env("ttt", "ttt:pattern:edges_first", seat=0)
    won = _run(
        mage_graph(GraphOptions(num_episodes=3, stop_on_success=True)),
        env,
        ScriptedChat(responses=moves, reflections=["<remark>ok</remark>"]),
        opponent="tic_tac_toe:pattern:edges_first",
    )
    assert [e["outcome"] for e in won["episodes"]] == ["won"]
    assert all(t["kind"] == "play" for t in won["turns"])
    full = _run(
        mage_graph(GraphOptions(num_episodes=3, stop_on_success=False)),
        env,
        ScriptedChat(responses=moves, reflections=["<remark>ok</remark>"]),
        opponent="tic_tac_toe:pattern:edges_first",
    )
    assert [e["outcome"] for e in full["episodes"]] == ["won", "won", "won"]


def test_history_context_shows_past_episodes_without_reflect_turns() -> None:
    llm = ScriptedChat(responses=["<action>BET</action>"], reflections=["<remark>x</remark>"])
    graph = mage_graph(
        GraphOptions(num_episodes=2, context="history", protocol="fresh", stop_on_success=False)
    )
    state = _run(graph, make_env("kuhn", "kuhn:aggressive", seat=0), llm)
    assert all(t["kind"] == "play" for t in state["turns"])
    last_prompt = state["turns"][-1]["prompt_text"][-1]["content"]
    assert "Earlier episodes against this opponent:" in last_prompt
    assert "Episode 1:" in last_prompt and "Result:" in last_prompt


def test_react_has_no_memory_and_asks_for_a_thought() -> None:
    llm = ScriptedChat(responses=["Thought: bet. <action>BET</action>"], reflections=["-"])
    graph = react_graph(GraphOptions(num_episodes=2, stop_on_success=False))
    assert "reflect" not in graph.mermaid()
    state = _run(graph, make_env("kuhn", "kuhn:aggressive", seat=0), llm)
    assert len(state["episodes"]) == 2
    prompts = [t["prompt_text"][-1]["content"] for t in state["turns"]]
    assert all("Thought:" in p and "Earlier episodes" not in p for p in prompts)


def test_unfinished_episode_counts_invalid_turns() -> None:
    llm = ScriptedChat(responses=["no tag here"], reflections=["<remark>x</remark>"])
    env = make_env("kuhn", "kuhn:aggressive", seat=0, max_turns=3)
    state = _run(mage_graph(GraphOptions(num_episodes=1)), env, llm)
    assert state["episodes"] == [
        {"index": 0, "outcome": "unfinished", "reward": 0.0, "payoff": None, "turns": 3,
         "invalid_actions": 3}
    ]  # fmt: skip
    assert all(t["invalid"] for t in state["turns"])
    assert "Your previous answer was invalid" in state["turns"][-1]["prompt_text"][-1]["content"]


def test_composition_inserts_a_node_before_play() -> None:
    calls: list[int] = []

    async def count_turns(state, runtime):
        calls.append(state["step"])
        return {}

    graph = build_meta_episode_graph(
        GraphOptions(num_episodes=2, stop_on_success=False),
        before={"play": ("count_turns", count_turns)},
    )
    assert "count_turns --> play" in graph.mermaid()
    llm = ScriptedChat(responses=["<action>PASS</action>"], reflections=["<remark>x</remark>"])
    state = _run(graph, make_env("kuhn", "kuhn:aggressive", seat=0), llm)
    assert len(calls) == sum(t["kind"] == "play" for t in state["turns"]) == 4


def test_builder_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="unknown node 'plya'"):
        build_meta_episode_graph(nodes={"plya": lambda s, r: {}})
    with pytest.raises(ValueError, match="already taken"):
        build_meta_episode_graph(before={"play": ("env_step", lambda s, r: {})})
    with pytest.raises(ValueError, match="no reflect node to replace or precede"):
        build_meta_episode_graph(GraphOptions(context="none"), before={"reflect": ("x", None)})
    with pytest.raises(ValueError, match="no reflect node to replace or precede"):
        build_meta_episode_graph(GraphOptions(context="history"), nodes={"reflect": lambda s: {}})
    with pytest.raises(ValueError, match="num_episodes must be in 1..10"):
        GraphOptions(num_episodes=11)
    with pytest.raises(ValueError, match="unknown context mode"):
        GraphOptions(context="memories")


@pytest.mark.parametrize("agent", ["mage", "react"])
def test_topology_snapshot(agent: str) -> None:
    graph = mage_graph() if agent == "mage" else react_graph()
    snapshot = SNAPSHOTS / f"{agent}.mmd"
    if os.environ.get(UPDATE_SNAPSHOTS) == "1":  # a deliberate change of topology
        snapshot.write_text(graph.mermaid())
    assert snapshot.exists(), (
        f"no snapshot {snapshot}; write it with {UPDATE_SNAPSHOTS}=1 python -m pytest "
        f"{Path(__file__).name}, check the diagram and commit it"
    )
    assert graph.mermaid() == snapshot.read_text(), (
        f"the {agent} graph's topology changed; if that is intended, rewrite the snapshot "
        f"with {UPDATE_SNAPSHOTS}=1 and commit it"
    )


def test_a_missing_snapshot_fails_until_written_on_purpose(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(globals(), "SNAPSHOTS", tmp_path)
    monkeypatch.delenv(UPDATE_SNAPSHOTS, raising=False)
    with pytest.raises(AssertionError, match="no snapshot"):
        test_topology_snapshot("react")
    assert list(tmp_path.iterdir()) == []  # nothing written behind the test's back
    monkeypatch.setenv(UPDATE_SNAPSHOTS, "1")
    test_topology_snapshot("react")
    assert (tmp_path / "react.mmd").read_text() == react_graph().mermaid()
