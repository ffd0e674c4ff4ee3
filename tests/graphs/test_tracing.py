"""Tracing every call of the run's chat model, whichever node makes it (SPEC §4).

The two-call graph is the planner of ``examples/extending/planner.py`` (plan, then act),
driven by the tiny model through the real engine, so the ids are the engine's own.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, TypedDict

import pytest
import torch
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph

from mage_rl.envs import Population, make_env
from mage_rl.graphs import (
    GraphOptions,
    agent_graph,
    build_meta_episode_graph,
    mage_graph,
    react_graph,
    reflexion_graph,
)
from mage_rl.graphs.rollouts import collect_rollouts, sample_tasks
from mage_rl.plugins import load_plugin
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny
from mage_rl.policy.tokenization import render_prompt
from mage_rl.rl.advantages import AdvantageConfig, compute_advantages
from mage_rl.rl.batching import samples_from_records
from mage_rl.rl.learner import Learner, LearnerConfig
from mage_rl.rl.returns import ReturnConfig
from tests.graphs.conftest import ScriptedChat

ROOT = Path(__file__).parents[2]
GOLDEN = Path(__file__).parent / "golden" / "builtin_samples_kuhn_tiny.json"


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = build_tiny(seed=0)
    with LocalEngine(model, tokenizer, max_batch_size=64, batch_wait_ms=20) as engine:
        yield model, tokenizer, engine


@pytest.fixture(scope="module")
def planner_records(tiny):
    load_plugin(str(ROOT / "examples" / "extending" / "planner.py"))
    _, _, engine = tiny
    llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=12)
    graph = agent_graph(
        "planner", GraphOptions(num_episodes=2, max_tokens=12, reflect_max_tokens=12)
    )
    tasks = sample_tasks(Population.parse("kuhn_train"), 2, base_seed=11)
    return asyncio.run(
        collect_rollouts(graph, llm, env_name="kuhn_poker", tasks=tasks, group_size=2, max_turns=3)
    )


def test_a_two_call_graph_gives_two_samples_per_step(tiny, planner_records) -> None:
    _, tokenizer, _ = tiny
    for record in planner_records:
        steps = sum(e.turns for e in record.episodes)
        in_steps = [t for t in record.turns if t.kind != "reflect"]
        assert len(in_steps) == 2 * steps
        for plan, act in zip(in_steps[::2], in_steps[1::2], strict=True):
            assert (plan.kind, plan.node, plan.acting) == ("call", "plan", False)
            assert (act.kind, act.node, act.acting) == ("play", "act", True)
            assert (plan.episode, plan.step) == (act.episode, act.step)
            assert plan.anchor == act.anchor  # the observation both calls saw
            assert f"Plan: {plan.text}" in act.prompt_text[-2]["content"]
            assert not plan.invalid  # only the environment judges the acting call
        # The environment's verdicts sit on the acting calls.
        invalid_steps = sum(e.invalid_actions for e in record.episodes)
        assert sum(t.invalid for t in record.turns if t.acting) == invalid_steps
        for turn in record.turns:  # exact ids: the engine's own prompt and response
            assert turn.prompt_ids == render_prompt(tokenizer, turn.prompt_text)
            assert len(turn.logprobs) == len(turn.response_ids) > 0
            assert tokenizer.decode(turn.response_ids, skip_special_tokens=True) == turn.text
        reflects = [t for t in record.turns if t.kind == "reflect"]
        assert [t.node for t in reflects] == ["reflect"] * (len(record.episodes) - 1)


def test_one_training_iteration_updates_on_both_calls(tiny, planner_records) -> None:
    model, _, _ = tiny
    advantages = compute_advantages(planner_records, ReturnConfig(invalid_penalty=2.0))
    samples = samples_from_records(planner_records, advantages)
    turns = [t for r in planner_records for t in r.turns]
    assert len(samples) == len(turns)
    by_node = {node: [s for s, t in zip(samples, turns, strict=True) if t.node == node]
               for node in ("plan", "act")}  # fmt: skip
    assert by_node["plan"] and by_node["act"]
    assert any(s.advantage != 0 for s in by_node["plan"])
    learner = Learner(build_tiny(seed=0)[0], LearnerConfig(lr=1e-2, dtype="fp32", kl_coef=0.0))
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    # Plan samples alone move the weights: the learner trains the non-acting calls too.
    stats = learner.update(by_node["plan"])
    assert stats["loss"] == stats["loss"]  # not NaN
    changed = [k for k, v in learner.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed


def test_builtin_agents_samples_are_unchanged() -> None:
    """Samples of the built-in agents equal the recorded ones (recorded before tracing
    existed; recorded again when the engine's draw changed, eb2585f)."""
    model, tokenizer = build_tiny(seed=0)
    golden = json.loads(GOLDEN.read_text())
    with LocalEngine(model, tokenizer, max_batch_size=16, batch_wait_ms=20) as engine:
        llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=16)
        tasks = sample_tasks(Population.parse("kuhn_train"), 2, base_seed=5)
        cases = {
            "mage": mage_graph(GraphOptions(num_episodes=3, stop_on_success=False,
                                            max_tokens=16, reflect_max_tokens=16)),
            "reflexion_constrained": reflexion_graph(GraphOptions(
                num_episodes=2, max_tokens=16, reflect_max_tokens=16, constrain_actions=True,
                prompt="compact")),
            "react": react_graph(GraphOptions(num_episodes=2, protocol="fresh", max_tokens=16)),
        }  # fmt: skip
        for name, graph in cases.items():
            records = asyncio.run(
                collect_rollouts(graph, llm, env_name="kuhn_poker", tasks=tasks, group_size=2,
                                 max_turns=3)
            )  # fmt: skip
            advantages = compute_advantages(
                records, ReturnConfig(invalid_penalty=2.0), AdvantageConfig()
            )
            rows = [
                (t.kind, t.episode, t.step, len(t.prompt_ids), t.response_ids, t.invalid)
                for r in records
                for t in r.turns
            ]
            expected = [
                (g["kind"], g["episode"], g["step"], g["prompt_len"], g["response_ids"],
                 g["invalid"])
                for g in golden[name]
            ]  # fmt: skip
            assert rows == expected, name  # the same calls and tokens, exactly
            # Log-probs and advantages to float tolerance: the batch a request lands in
            # moves the logits' last bits (docs/policy.md).
            got = [v for r in records for t in r.turns for v in t.logprobs]
            want = [v for g in golden[name] for v in g["logprobs"]]
            assert got == pytest.approx(want, abs=2e-4), name
            flat = [a for advs in advantages for a in advs]
            assert flat == pytest.approx([g["advantage"] for g in golden[name]], abs=1e-5), name


class PlanAct(TypedDict, total=False):
    messages: list
    action: str


async def _plan(state: PlanAct, runtime) -> dict[str, Any]:
    ctx = runtime.context
    note = HumanMessage(f"task {ctx.task_seed}: plan first")
    reply = await ctx.llm.ainvoke([*state["messages"], note], max_tokens=6)
    return {"messages": [*state["messages"], note, reply]}


async def _act(state: PlanAct, runtime) -> dict[str, Any]:
    reply = await runtime.context.llm.ainvoke(state["messages"], max_tokens=6)
    return {"action": str(reply.content)}


def _plan_act_graph() -> Any:
    g = StateGraph(PlanAct)
    g.add_node("plan", _plan)
    g.add_node("act", _act)
    g.add_edge(START, "plan")
    g.add_edge("plan", "act")
    g.add_edge("act", END)
    return g.compile()


def test_64_concurrent_meta_episodes_keep_their_own_samples(tiny) -> None:
    _, _, engine = tiny
    llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=6)
    graph = build_meta_episode_graph(
        GraphOptions(num_episodes=2, max_tokens=6, reflect_max_tokens=6), policy=_plan_act_graph()
    )
    tasks = sample_tasks(Population.parse("kuhn_train"), 16, base_seed=3)
    records = asyncio.run(
        collect_rollouts(graph, llm, env_name="kuhn_poker", tasks=tasks, group_size=4,
                         concurrency=64, max_turns=2)
    )  # fmt: skip
    assert len(records) == 64
    for record in records:
        turns = [t for t in record.turns if t.kind != "reflect"]
        assert len(turns) == 2 * sum(e.turns for e in record.episodes)
        for plan, act in zip(turns[::2], turns[1::2], strict=True):
            # The plan call saw this record's task seed; the act call saw this record's
            # own plan reply, right before it.
            assert f"task {record.seed}:" in plan.prompt_text[-1]["content"]
            assert act.prompt_text[-1] == {"role": "assistant", "content": plan.text}
            assert act.prompt_text[:-1] == plan.prompt_text


def test_text_only_models_other_models_and_marks() -> None:
    """A chat model without ids is traced with its text; a second model is not traced;
    a node can keep a call out of training."""
    judge = FakeListChatModel(responses=["fine"])

    async def play(state, runtime):
        ctx = runtime.context
        verdict = await judge.ainvoke("is this fine?")  # another model: not a sample
        draft = await ctx.llm.ainvoke([HumanMessage("draft " + verdict.content)])
        ctx.tracer.mark(draft, trained=False)
        reply = await ctx.llm.ainvoke([HumanMessage("act")])
        return {"action": reply.content}

    llm = FakeListChatModel(responses=["a b c", "<action>PASS</action>"])
    graph = build_meta_episode_graph(GraphOptions(num_episodes=1), nodes={"play": play})
    state = asyncio.run(
        graph.run(make_env("kuhn", "kuhn:aggressive", seat=0), llm, task_seed=1,
                  opponent="kuhn_poker:aggressive")
    )  # fmt: skip
    turns = state["turns"]
    assert [(t["kind"], t["trained"]) for t in turns[:2]] == [("call", False), ("play", True)]
    assert all(t["node"] == "play" for t in turns)
    assert turns[0]["text"] == "a b c" and turns[0]["response_ids"] == []
    assert turns[0]["response_length"] == 3  # words, without token ids
    assert len(turns) == 2 * state["episodes"][0]["turns"]


def test_inserted_node_second_param_name_and_extra() -> None:
    """A node before play on Tic-Tac-Toe (every turn three super-steps) finishes; a
    node's second parameter may have any name; run(extra=) hands over the caller's dict."""
    seen: dict[str, Any] = {}

    def count(state, ctx):  # not named "runtime"
        ctx.context.extra["steps"] = ctx.context.extra.get("steps", 0) + 1
        return {}

    llm = ScriptedChat(responses=["no tag"], reflections=["<remark>r</remark>"])
    graph = mage_graph(GraphOptions(num_episodes=3), before={"play": ("count", count)})
    env = make_env("ttt", "ttt:random", seat=0)
    state = asyncio.run(graph.run(env, llm, task_seed=2, opponent="tic_tac_toe:random",
                                  extra=seen))  # fmt: skip
    assert [e["turns"] for e in state["episodes"]] == [env.max_turns] * 3
    assert seen["steps"] == 3 * env.max_turns
