"""An agent as a plugin: a planner that calls the model twice per step.

The graph is an ordinary LangGraph. It plays each step where the built-in ``play`` node
would: first a short plan, then the action, conditioned on the plan. Both calls go to
``runtime.context.llm``, the run's chat model, so both are traced and trained; the
action call is the step's *acting* call (the last one before the environment steps) and
the plan call takes the action's return (SPEC §4).

    mage train examples/extending/planner_kuhn_tiny.yaml   # plugins: [planner.py]
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from mage_rl.graphs import MetaEpisodeContext, register_agent


class PlannerState(TypedDict, total=False):
    messages: list[BaseMessage]  # the play prompt, given by the meta-episode
    legal_actions: list[str]  # given by the meta-episode
    plan: str
    action: str  # read back by the meta-episode


async def plan(state: PlannerState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    ask = HumanMessage("Before you answer, write a one-line plan. Do not answer yet.")
    reply = await runtime.context.llm.ainvoke([*state["messages"], ask], max_tokens=16, stop=["\n"])
    return {"plan": str(reply.content)}


async def act(state: PlannerState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    ctx = runtime.context
    messages = [
        *state["messages"],
        AIMessage(f"Plan: {state['plan']}"),
        HumanMessage("Now give your move inside <action></action> tags."),
    ]
    kwargs: dict[str, Any] = {"max_tokens": ctx.options.max_tokens, "stop": ["</action>"]}
    if ctx.options.constrain_actions:  # policy.constrain_actions in the config
        kwargs["choices"] = [f"<action>{a}</action>" for a in state["legal_actions"]]
    reply = await ctx.llm.ainvoke(messages, **kwargs)
    return {"action": str(reply.content)}


builder = StateGraph(PlannerState, context_schema=MetaEpisodeContext)
builder.add_node("plan", plan)
builder.add_node("act", act)
builder.add_edge(START, "plan")
builder.add_edge("plan", "act")
builder.add_edge("act", END)
planner = builder.compile(name="planner")

register_agent("planner", planner)
