"""The agent registry: the graphs ``meta.agent``, ``mage eval --agent`` and ``mage train`` name.

An agent is registered as a *builder* ``fn(options) -> MetaEpisodeGraph`` or as a
compiled LangGraph that plays each step (the episode policy; the meta-episode wraps it).
A builder may also return a compiled graph; it is then wrapped the same way::

    from mage_rl.graphs import register_agent

    register_agent("planner", planner_graph)                 # a compiled LangGraph
    register_agent("critic", lambda options: build_meta_episode_graph(
        options, before={"play": ("critic", critic)}, name="critic"))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mage_rl.graphs.meta_episode import MetaEpisodeGraph, build_meta_episode_graph
from mage_rl.nodes.state import GraphOptions
from mage_rl.registry import Registry

AgentBuilder = Callable[..., Any]

AGENT_GRAPHS: Registry[AgentBuilder] = Registry("agent")
"""Registered agents by name: ``mage``, ``reflexion``, ``react`` and those of plugins."""


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


def register_agent(name: str, agent: Any, *, replace: bool = False) -> None:
    """Register an agent under ``name`` for configs (``meta.agent``) and every command.

    Args:
        name: The agent's name.
        agent: A builder ``fn(options: GraphOptions) -> MetaEpisodeGraph`` (or returning
            a compiled LangGraph, used as the episode policy), or a compiled LangGraph
            used as the episode policy.
        replace: Replace an agent registered under the same name.

    Raises:
        TypeError: ``agent`` is neither callable nor a compiled graph.
    """
    if not (hasattr(agent, "ainvoke") or callable(agent)):
        raise TypeError(
            f"register_agent({name!r}): give a builder fn(options) -> MetaEpisodeGraph or a "
            f"compiled LangGraph, got {agent!r}"
        )
    AGENT_GRAPHS.register(name, agent, replace=replace)


def agent_graph(agent: str, options: GraphOptions | None = None, **kwargs: Any) -> MetaEpisodeGraph:
    """The graph of a registered agent, built with ``options``.

    Raises:
        ValueError: An unknown agent (the message lists the registered ones).
        TypeError: The builder returned something that is not a graph.
    """
    entry = AGENT_GRAPHS.get(agent)
    options = options or GraphOptions()
    if hasattr(entry, "ainvoke"):
        return build_meta_episode_graph(options, policy=entry, name=agent, **kwargs)
    built = entry(options, **kwargs)
    if isinstance(built, MetaEpisodeGraph):
        return built
    if hasattr(built, "ainvoke"):
        return build_meta_episode_graph(options, policy=built, name=agent)
    raise TypeError(
        f"agent {agent!r}: its builder returned {type(built).__name__}; return a "
        "MetaEpisodeGraph (build_meta_episode_graph) or a compiled LangGraph policy"
    )


AGENT_GRAPHS.register("mage", mage_graph)
AGENT_GRAPHS.register("reflexion", reflexion_graph)
AGENT_GRAPHS.register("react", react_graph)
