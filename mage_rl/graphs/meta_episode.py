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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import END, START, StateGraph

from mage_rl.envs.base import TextEnv
from mage_rl.graphs.state import GraphOptions, MetaEpisodeContext, MetaEpisodeState
from mage_rl.nodes.core import env_step, play, reflect, reset_episode

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


@dataclass
class MetaEpisodeGraph:
    """A compiled meta-episode graph and the options it was built with."""

    compiled: Any
    options: GraphOptions
    name: str = "mage"

    async def run(
        self,
        env: TextEnv,
        llm: BaseChatModel,
        *,
        task_seed: int,
        opponent: str,
        extra: dict[str, Any] | None = None,
    ) -> MetaEpisodeState:
        """Play one meta-episode; returns the final state."""
        context = MetaEpisodeContext(
            env=env,
            llm=llm,
            options=self.options,
            task_seed=task_seed,
            opponent=opponent,
            extra=extra or {},
        )
        # Each play turn is two super-steps (play, env_step); leave ample room.
        per_episode = 2 * env.max_turns + 4
        limit = self.options.num_episodes * per_episode + 10
        empty: MetaEpisodeState = {"memory": [], "history": [], "episodes": [], "turns": []}
        return await self.compiled.ainvoke(
            empty, context=context, config={"recursion_limit": limit}
        )

    def mermaid(self) -> str:
        """The graph's topology as Mermaid text (pinned by a snapshot test)."""
        return self.compiled.get_graph().draw_mermaid()


def build_meta_episode_graph(
    options: GraphOptions | None = None,
    *,
    nodes: Mapping[str, NodeFn] | None = None,
    before: Mapping[str, tuple[str, NodeFn]] | None = None,
    name: str = "mage",
) -> MetaEpisodeGraph:
    """Build the meta-episode graph.

    Args:
        options: How to play (K, context mode, protocol, ...).
        nodes: Replacements for built-in nodes, by name (``reset_episode``, ``play``,
            ``env_step``, ``reflect``). A replacement has the built-in's signature
            ``fn(state, runtime) -> dict`` and returns the keys it changes.
        before: Extra nodes: ``{"play": ("critic", fn)}`` runs ``fn`` every time the
            graph is about to enter ``play``. The node may read the state and the run
            context and return keys to change (or ``{}``).
        name: Agent name recorded with each meta-episode.

    Raises:
        ValueError: An unknown node name, a name clash, or a reflect node asked for
            while the context mode has no reflection.
    """
    options = options or GraphOptions()
    impl = dict(BUILTIN_NODES)
    for key, fn in (nodes or {}).items():
        if key not in impl:
            raise ValueError(f"cannot replace unknown node {key!r}; nodes: {', '.join(impl)}")
        impl[key] = fn
    if not options.reflects:
        del impl["reflect"]
    inserted: dict[str, str] = {}
    extra_nodes: dict[str, NodeFn] = {}
    for target, (new_name, fn) in (before or {}).items():
        if target not in impl:
            raise ValueError(
                f"cannot insert before {target!r}: the graph's nodes are {', '.join(impl)}"
            )
        if new_name in impl or new_name in extra_nodes or new_name in (START, END):
            raise ValueError(f"node name {new_name!r} is already taken; choose another")
        inserted[target] = new_name
        extra_nodes[new_name] = fn

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
    return MetaEpisodeGraph(graph.compile(name=name), options, name)


def mage_graph(options: GraphOptions | None = None, **kwargs: Any) -> MetaEpisodeGraph:
    """MAGE: the meta-episode with reflections (trained weights make it MAGE)."""
    return build_meta_episode_graph(options or GraphOptions(), name="mage", **kwargs)


def reflexion_graph(options: GraphOptions | None = None, **kwargs: Any) -> MetaEpisodeGraph:
    """Reflexion: reflection memory across episodes, frozen weights."""
    opts = replace(options or GraphOptions(), context="reflection", react=False)
    return build_meta_episode_graph(opts, name="reflexion", **kwargs)


def react_graph(options: GraphOptions | None = None, **kwargs: Any) -> MetaEpisodeGraph:
    """ReAct: reason, then act, within one episode; no memory across episodes."""
    opts = replace(options or GraphOptions(), context="none", react=True)
    return build_meta_episode_graph(opts, name="react", **kwargs)


AGENT_GRAPHS: dict[str, Callable[..., MetaEpisodeGraph]] = {
    "mage": mage_graph,
    "reflexion": reflexion_graph,
    "react": react_graph,
}


def agent_graph(agent: str, options: GraphOptions | None = None, **kwargs: Any) -> MetaEpisodeGraph:
    """The graph of a named agent (``mage``, ``reflexion``, ``react``)."""
    if agent not in AGENT_GRAPHS:
        raise ValueError(f"unknown agent {agent!r}; valid: {', '.join(AGENT_GRAPHS)}")
    return AGENT_GRAPHS[agent](options, **kwargs)
