"""The meta-episode as a LangGraph ``StateGraph`` (SPEC §2).

::

    START -> reset_episode -> play -> env_step -+-> play            (episode goes on)
                 ^                              +-> reflect -> reset_episode
                 +------------------------------+-> reset_episode   (no reflection)
                                                +-> END             (K done, or won and
                                                                     stop_on_success)

The agents of the paper's comparison are this graph with different options: MAGE and
Reflexion write reflections between episodes (MAGE's weights are trained, Reflexion's are
frozen); ReAct reasons before acting and carries nothing across episodes.

A user's own episode policy, any compiled LangGraph, can stand where ``play`` stands
(:mod:`mage_rl.graphs.policy`); the meta-episode around it resets, steps the environment,
reflects and keeps the memory. Every call either makes to the run's chat model is traced
(:mod:`mage_rl.nodes.tracing`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from mage_rl.envs.base import TextEnv
from mage_rl.graphs.policy import policy_node
from mage_rl.nodes.core import env_step, play, reflect, reset_episode
from mage_rl.nodes.state import GraphOptions, MetaEpisodeContext, MetaEpisodeState
from mage_rl.nodes.tracing import Tracer, tag_policy

NodeFn = Callable[..., Awaitable[dict[str, Any]] | dict[str, Any]]
BUILTIN_NODES: dict[str, NodeFn] = {
    "reset_episode": reset_episode,
    "play": play,
    "env_step": env_step,
    "reflect": reflect,
}


def make_router(options: GraphOptions) -> Callable[[MetaEpisodeState], str]:
    """The router after ``env_step``: continue the episode, reflect, restart, or end."""

    def should_continue(state: MetaEpisodeState) -> str:
        if not state.get("episode_done"):
            return "play"
        if state.get("meta_done"):
            return END
        return "reflect" if options.reflects else "reset_episode"

    return should_continue


def as_node(fn: Any, name: str) -> Any:
    """A user's node as LangGraph expects it.

    A function may take ``(state)`` or ``(state, context_like)`` whatever its second
    parameter is called: LangGraph injects the run's ``Runtime`` only into a parameter
    named ``runtime``, so a function whose second parameter has another name gets the
    runtime passed positionally. Runnables (compiled graphs) pass through unchanged.

    Raises:
        TypeError: ``fn`` is neither callable nor a runnable, or takes more than two
            required positional parameters.
    """
    if isinstance(fn, Runnable):
        return fn
    if not callable(fn):
        raise TypeError(f"node {name!r} must be a function or a LangGraph runnable, got {fn!r}")
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in params if p.default is p.empty]
    if len(required) > 2:
        raise TypeError(
            f"node {name!r} takes {len(required)} required parameters; a node is "
            "fn(state) or fn(state, runtime)"
        )
    if len(params) < 2 or params[1].name == "runtime":
        return fn

    async def node(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> Any:
        out = fn(state, runtime)
        return await out if inspect.isawaitable(out) else out

    node.__name__ = getattr(fn, "__name__", name)
    return node


@dataclass
class MetaEpisodeGraph:
    """A compiled meta-episode graph and the options it was built with."""

    compiled: Any
    options: GraphOptions
    name: str = "mage"
    steps_per_turn: int = 2

    async def run(
        self,
        env: TextEnv,
        llm: BaseChatModel,
        *,
        task_seed: int,
        opponent: str,
        extra: dict[str, Any] | None = None,
        tracer: Tracer | None = None,
    ) -> MetaEpisodeState:
        """Play one meta-episode; returns the final state, ``turns`` holding every call.

        Args:
            env: The environment, bound to its opponent and seat.
            llm: The run's chat model; every call of it is traced.
            task_seed: Seed of the task instance.
            opponent: Opponent id.
            extra: Room for user nodes, given to them as ``runtime.context.extra`` (this
                very dict, so a node's writes are visible to the caller).
            tracer: The tracer that records the calls (default: a new one); a caller
                that passes its own can read the calls while the meta-episode runs.
        """
        tracer = tracer if tracer is not None else Tracer(opponent)
        context = MetaEpisodeContext(
            env=env,
            llm=tag_policy(llm),
            options=self.options,
            task_seed=task_seed,
            opponent=opponent,
            extra=extra if extra is not None else {},
            tracer=tracer,
        )
        # One episode runs reset_episode, then per turn every node of the play loop,
        # then reflect and its inserted nodes; leave room on top.
        per_episode = self.steps_per_turn * (env.max_turns + 1) + 4
        limit = self.options.num_episodes * per_episode + 10
        empty: MetaEpisodeState = {"memory": [], "history": [], "episodes": [], "turns": []}
        state = await self.compiled.ainvoke(
            empty,
            context=context,
            config={"recursion_limit": limit, "callbacks": [tracer]},
        )
        turns = tracer.turns
        state["turns"] = [turn.to_dict() for turn in turns]
        if state.get("conversation"):
            state["conversation_trace"] = conversation_trace(state["conversation"], len(turns))
        return state

    def mermaid(self) -> str:
        """The graph's topology as Mermaid text (pinned by a snapshot test)."""
        return self.compiled.get_graph().draw_mermaid()


def conversation_trace(conversation: dict[str, Any], calls: int) -> dict[str, Any]:
    """The record's form of a finished conversation: its ids and one ``[start, end, turn]``
    segment per call (every traced call of the meta-episode is a call of the chat).

    Raises:
        ValueError: The conversation has not one response per traced call (a node made
            calls outside the conversation, which the layout cannot train as one sequence).
    """
    segments = conversation["segments"]
    if len(segments) != calls:
        raise ValueError(
            f"the conversation holds {len(segments)} responses but the meta-episode made "
            f"{calls} traced calls; in the conversation layout every call of the run's "
            "chat model must go through the conversation (use the built-in play and "
            "reflect nodes, or the re-rendered layout)"
        )
    return {
        "ids": list(conversation["ids"]),
        "segments": [[int(s), int(e), j] for j, (s, e) in enumerate(segments)],
    }


def build_meta_episode_graph(
    options: GraphOptions | None = None,
    *,
    nodes: Mapping[str, Any] | None = None,
    before: Mapping[str, tuple[str, Any]] | None = None,
    policy: Any = None,
    name: str = "mage",
) -> MetaEpisodeGraph:
    """Build the meta-episode graph.

    Args:
        options: How to play (K, context mode, protocol, ...).
        nodes: Replacements for built-in nodes, by name (``reset_episode``, ``play``,
            ``env_step``, ``reflect``). A replacement is ``fn(state)`` or
            ``fn(state, runtime)`` (sync or async) and returns the keys it changes.
        before: Extra nodes: ``{"play": ("critic", fn)}`` runs ``fn`` every time the
            graph is about to enter ``play``. The node may read the state and the run
            context and return keys to change (or ``{}``).
        policy: A compiled LangGraph that plays each step in place of ``play``: it gets
            the play prompt as ``messages`` and the step's state, and returns the action
            (see :mod:`mage_rl.graphs.policy`).
        name: Agent name recorded with each meta-episode.

    Raises:
        ValueError: An unknown node name, a name clash, a node for ``reflect`` while
            the context mode has no reflection, or both ``policy`` and
            ``nodes["play"]``.
    """
    options = options or GraphOptions()
    impl: dict[str, Any] = dict(BUILTIN_NODES)
    for key, fn in (nodes or {}).items():
        if key not in impl:
            raise ValueError(f"cannot replace unknown node {key!r}; nodes: {', '.join(impl)}")
        impl[key] = as_node(fn, key)
    if policy is not None:
        if nodes and "play" in nodes:
            raise ValueError("give either policy= or nodes={'play': ...}, not both")
        if options.layout == "conversation":
            raise ValueError(
                "a policy graph renders its own prompts, so it cannot play in the "
                "conversation layout; use layout='rerendered'"
            )
        impl["play"] = policy_node(policy)
    if not options.reflects:
        if (nodes and "reflect" in nodes) or (before and "reflect" in before):
            raise ValueError(
                f"context mode {options.context!r} writes no reflections, so the graph has "
                "no reflect node to replace or precede; use a context with 'reflection' "
                "or drop the reflect node"
            )
        del impl["reflect"]
    inserted: dict[str, str] = {}
    extra_nodes: dict[str, Any] = {}
    for target, (new_name, fn) in (before or {}).items():
        if target not in impl:
            raise ValueError(
                f"cannot insert before {target!r}: the graph's nodes are {', '.join(impl)}"
            )
        if new_name in impl or new_name in extra_nodes or new_name in (START, END):
            raise ValueError(f"node name {new_name!r} is already taken; choose another")
        inserted[target] = new_name
        extra_nodes[new_name] = as_node(fn, new_name)

    def entry(node: str) -> str:
        return inserted.get(node, node)

    graph = StateGraph(MetaEpisodeState, context_schema=MetaEpisodeContext)
    for key, fn in impl.items():
        graph.add_node(key, fn)
    for target, new_name in inserted.items():
        graph.add_node(new_name, extra_nodes[new_name])
        graph.add_edge(new_name, target)
    graph.add_edge(START, entry("reset_episode"))
    graph.add_edge("reset_episode", entry("play"))
    graph.add_edge("play", entry("env_step"))
    routes = {"play": entry("play"), "reset_episode": entry("reset_episode"), END: END}
    if options.reflects:
        routes["reflect"] = entry("reflect")
        graph.add_edge("reflect", entry("reset_episode"))
    graph.add_conditional_edges("env_step", make_router(options), routes)
    steps_per_turn = 2 + len(inserted)
    return MetaEpisodeGraph(graph.compile(name=name), options, name, steps_per_turn)
