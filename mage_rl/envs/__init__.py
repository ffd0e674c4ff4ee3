"""Text environments and opponents.

``make_env("kuhn_poker", "kuhn:aggressive", seat=0)`` builds an environment; opponents
are named by spec strings (see :mod:`mage_rl.envs.opponents`). The single-agent
Sokoban takes a room variant where the games take an opponent:
``make_env("sokoban", "sokoban:boxes:2")``. Environments, opponents and population
presets live in registries (:mod:`mage_rl.envs.registry`) that user code adds to.
"""

from __future__ import annotations

from mage_rl.envs.base import (
    PROTOCOLS,
    StepInfo,
    StepResult,
    TextEnv,
    derive_seed,
    episode_seed,
    resolve_seat,
)
from mage_rl.envs.builtins import register_builtins
from mage_rl.envs.openspiel_env import GameRules, OpenSpielEnv
from mage_rl.envs.opponents import (
    POPULATION_PRESETS,
    Opponent,
    Population,
    available_opponents,
    canonical_spec,
    make_opponent,
    register_opponent,
    register_opponent_factory,
    register_population,
)
from mage_rl.envs.registry import (
    ENVS,
    EnvSpec,
    LiveNames,
    canonical_game,
    env_names,
    env_spec,
    make_env,
    register_env,
)


def game_rules(game: str) -> GameRules:
    """The rules object of an OpenSpiel environment name or alias (``kuhn``, ``ttt``...)."""
    spec = env_spec(game)
    if spec.rules is None:
        games = [n for n in env_names() if env_spec(n).rules is not None]
        raise ValueError(f"{spec.name} is not an OpenSpiel game; games: {', '.join(games)}")
    return spec.rules


ENV_NAMES = LiveNames()
"""Registered environment names (a live view: plugins add to it)."""
SINGLE_AGENT_ENVS = LiveNames(single_agent_only=True)
"""Environments with one seat (0); their "opponent" spec names a task variant."""

register_builtins()

__all__ = [
    "ENVS",
    "ENV_NAMES",
    "EnvSpec",
    "POPULATION_PRESETS",
    "PROTOCOLS",
    "SINGLE_AGENT_ENVS",
    "GameRules",
    "OpenSpielEnv",
    "Opponent",
    "Population",
    "StepInfo",
    "StepResult",
    "TextEnv",
    "available_opponents",
    "canonical_game",
    "canonical_spec",
    "derive_seed",
    "env_names",
    "env_spec",
    "episode_seed",
    "game_rules",
    "make_env",
    "make_opponent",
    "register_opponent",
    "register_env",
    "register_opponent_factory",
    "register_population",
    "resolve_seat",
]
