"""Text environments and opponents.

``make_env("kuhn_poker", "kuhn:aggressive", seat=0)`` builds an environment; opponents
are named by spec strings (see :mod:`mage_rl.envs.opponents`). The single-agent
Sokoban takes a room variant where the games take an opponent:
``make_env("sokoban", "sokoban:boxes:2")``.
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
from mage_rl.envs.openspiel_env import GameRules, OpenSpielEnv
from mage_rl.envs.opponents import (
    POPULATION_PRESETS,
    Opponent,
    Population,
    available_opponents,
    canonical_game,
    canonical_spec,
    make_opponent,
    register_opponent,
    register_opponent_factory,
)


def game_rules(game: str) -> GameRules:
    """The rules object of a game name or alias (``kuhn``, ``ttt``...)."""
    from mage_rl.envs.kuhn import KuhnRules
    from mage_rl.envs.tictactoe import TicTacToeRules

    rules = {"kuhn_poker": KuhnRules, "tic_tac_toe": TicTacToeRules}
    name = canonical_game(game)
    if name not in rules:
        raise ValueError(f"no text environment for {game!r}; valid: {', '.join(rules)}")
    return rules[name]()


ENV_NAMES = ("kuhn_poker", "tic_tac_toe", "sokoban")
SINGLE_AGENT_ENVS = ("sokoban",)
"""Environments with one seat (0); their "opponent" spec names a task variant."""


def make_env(
    game: str,
    opponent: str | Opponent,
    seat: int = 0,
    max_turns: int | None = None,
) -> TextEnv:
    """Build a text environment against one opponent (or of one task variant).

    Args:
        game: ``kuhn_poker``/``kuhn``, ``tic_tac_toe``/``ttt`` or ``sokoban``.
        opponent: An opponent spec string or an :class:`Opponent`; for Sokoban a room
            variant such as ``sokoban:boxes:2``.
        seat: The agent's seat (0 = first to act; Sokoban has only seat 0).
        max_turns: Agent turns per episode (game default when ``None``).
    """
    if canonical_game(game) == "sokoban":
        from mage_rl.envs.sokoban import make_sokoban_env

        return make_sokoban_env(opponent, seat=seat, max_turns=max_turns)
    rules = game_rules(game)
    if isinstance(opponent, str):
        if canonical_game(opponent.split(":")[0]) != rules.game_name:
            raise ValueError(f"opponent {opponent!r} does not play {rules.game_name}")
        opponent = make_opponent(opponent)
    return OpenSpielEnv(rules, opponent, seat=seat, max_turns=max_turns)


__all__ = [
    "ENV_NAMES",
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
    "episode_seed",
    "game_rules",
    "make_env",
    "make_opponent",
    "register_opponent",
    "register_opponent_factory",
    "resolve_seat",
]
