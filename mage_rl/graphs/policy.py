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
graph's state has one and sets it, else the text of the last message in ``messages``
(so a graph built on ``MessagesState`` works as it is). A graph only receives the keys
its own state schema declares. The last call to the run's chat model before the
environment steps is the step's acting call unless a node marks another
(``runtime.context.tracer.mark(reply, acting=True)``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from langchain_core.messages import BaseMessage
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


def policy_action(output: Any) -> str:
    """The action text of a policy graph's output.

    Raises:
        ValueError: The output has neither an ``action`` string nor a last message.
    """
    if isinstance(output, dict):
        action = output.get("action")
        if isinstance(action, str) and action:
            return action
        messages = output.get("messages")
        if messages and isinstance(messages[-1], BaseMessage):
            return message_text(messages[-1])
    raise ValueError(
        "the policy graph returned neither an 'action' string nor 'messages' ending in the "
        f"model's reply (got keys {sorted(output) if isinstance(output, dict) else output!r}); "
        "give its state an 'action: str' key and set it, or append the reply to 'messages'"
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

    async def play(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict:
        output = await graph.ainvoke(policy_input(state, runtime.context), context=runtime.context)
        return {"action": policy_action(output)}

    return play
