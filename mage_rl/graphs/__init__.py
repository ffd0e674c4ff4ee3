"""The meta-episode graph, its state schema, and the agents built from it."""

from __future__ import annotations

from mage_rl.graphs.meta_episode import (
    AGENT_GRAPHS,
    MetaEpisodeGraph,
    agent_graph,
    build_meta_episode_graph,
    mage_graph,
    react_graph,
    reflexion_graph,
)
from mage_rl.graphs.state import GraphOptions, MetaEpisodeContext, MetaEpisodeState

__all__ = [
    "AGENT_GRAPHS",
    "GraphOptions",
    "MetaEpisodeContext",
    "MetaEpisodeGraph",
    "MetaEpisodeState",
    "agent_graph",
    "build_meta_episode_graph",
    "mage_graph",
    "react_graph",
    "reflexion_graph",
]
