"""The meta-episode graph, its state schema, the agents built from it, and the registry
that user agents join."""

from __future__ import annotations

from mage_rl.graphs.agents import (
    AGENT_GRAPHS,
    agent_graph,
    mage_graph,
    react_graph,
    reflexion_graph,
    register_agent,
)
from mage_rl.graphs.meta_episode import MetaEpisodeGraph, build_meta_episode_graph
from mage_rl.graphs.policy import POLICY_INPUT_KEYS, policy_input
from mage_rl.nodes.state import GraphOptions, MetaEpisodeContext, MetaEpisodeState
from mage_rl.nodes.tracing import POLICY_TAG, Tracer

__all__ = [
    "AGENT_GRAPHS",
    "POLICY_INPUT_KEYS",
    "POLICY_TAG",
    "GraphOptions",
    "MetaEpisodeContext",
    "MetaEpisodeGraph",
    "MetaEpisodeState",
    "Tracer",
    "agent_graph",
    "build_meta_episode_graph",
    "mage_graph",
    "policy_input",
    "react_graph",
    "reflexion_graph",
    "register_agent",
]
