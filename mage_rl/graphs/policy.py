"""A user's compiled LangGraph as the episode policy, standing where ``play`` stands.

The meta-episode keeps what only it can do (reset the environment, step it, reflect, keep
the memory); the user's graph decides each step's action, with as many model calls and
nodes as it likes. It is invoked once per environment step with the run context (so its
nodes reach ``runtime.context.llm``, ``.env`` and ``.tracer``) and this input:

============================  ==========================================================
key                           value
============================  ==========================================================
``messages``                  the play prompt the built-in ``play`` would send
                              (LangChain messages: system, then user)
``observation``               the latest observation
``initial_observation``       the episode's first observation
``moves``                     the episode's moves so far (text)
``legal_actions``             the actions the environment accepts now (text)
``invalid_reason``            why the previous answer was invalid ("" if it was valid)
``memory``                    reflections of earlier episodes
``history``                   finished episodes (``PastEpisode`` dicts)
``episode``, ``step``         where the meta-episode is
============================  ==========================================================

Its output gives the response the environment consumes: the ``action`` key when the
graph's state has one and sets it, else the text of the last message in ``messages`` when
that message is the model's reply (an ``AIMessage``; so a graph built on
``MessagesState`` that appends its reply works as it is). Any other output is an error
naming the graph and the keys it returned: a graph that forgets to append its reply
returns the prompt's own user message last, and sending that text to the environment
would only play invalid moves. A graph only receives the keys its own state schema
declares. The last call to the run's chat model before the
environment steps is the step's acting call unless a node marks another
(``runtime.context.tracer.mark(reply, acting=True)``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.runtime import Runtime

from mage_rl.nodes.core import message_text, play_prompt
from mage_rl.nodes.prompts import to_langchain
from mage_rl.nodes.state import MetaEpisodeContext, MetaEpisodeState

POLICY_INPUT_KEYS = (
    "messages",
    "observation",
    "initial_observation",
    "moves",
    "legal_actions",
    "invalid_reason",
    "memory",
    "history",
    "episode",
    "step",
)


def policy_input(state: MetaEpisodeState, ctx: MetaEpisodeContext) -> dict[str, Any]:
    """What a policy graph is given for the current step (see the module docstring)."""
    return {
        "messages": to_langchain(play_prompt(state, ctx)),
        "observation": state["observation"],
        "initial_observation": state["initial_observation"],
        "moves": list(state.get("moves", [])),
        "legal_actions": ctx.env.legal_actions(),
        "invalid_reason": state.get("invalid_reason", ""),
        "memory": list(state.get("memory", [])),
        "history": list(state.get("history", [])),
        "episode": state["episode"],
        "step": state.get("step", 0),
    }


def policy_action(output: Any, graph: str = "policy") -> str:
    """The action text of a policy graph's output.

    Args:
        output: What the graph returned.
        graph: The graph's name, for the error message.

    Raises:
        ValueError: The output has neither an ``action`` string nor ``messages`` ending in
            an ``AIMessage``.
    """
    got = repr(output)
    if isinstance(output, dict):
        action = output.get("action")
        if isinstance(action, str) and action:
            return action
        messages = output.get("messages")
        last = messages[-1] if messages else None
        if isinstance(last, AIMessage):
            return message_text(last)
        got = f"keys {sorted(output)}"
        if isinstance(last, BaseMessage):
            got += f", 'messages' ending in a {type(last).__name__}"
    raise ValueError(
        f"the policy graph {graph!r} returned no action: neither an 'action' string nor "
        f"'messages' ending in the model's reply (an AIMessage); got {got}. Give its state "
        "an 'action: str' key and set it, or append the model's reply to 'messages'"
    )


def policy_node(
    graph: Any,
) -> Callable[[MetaEpisodeState, Runtime[MetaEpisodeContext]], Coroutine[Any, Any, dict]]:
    """Wrap a compiled graph as the meta-episode's ``play`` node.

    Raises:
        TypeError: ``graph`` has no ``ainvoke`` (compile the ``StateGraph`` first).
    """
    if not hasattr(graph, "ainvoke"):
        raise TypeError(
            f"policy must be a compiled LangGraph (StateGraph(...).compile()), got {graph!r}"
        )

    name = str(getattr(graph, "name", None) or "policy")

    async def play(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict:
        output = await graph.ainvoke(policy_input(state, runtime.context), context=runtime.context)
        return {"action": policy_action(output, name)}

    return play
