"""Text environments and opponents.

``make_env("kuhn_poker", "kuhn:aggressive", seat=0)`` builds an environment; opponents
are named by spec strings (see :mod:`mage_rl.envs.opponents`).
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


ENV_NAMES = ("kuhn_poker", "tic_tac_toe")


def make_env(
    game: str,
    opponent: str | Opponent,
    seat: int = 0,
    max_turns: int | None = None,
) -> OpenSpielEnv:
    """Build a text environment against one opponent.

    Args:
        game: ``kuhn_poker``/``kuhn`` or ``tic_tac_toe``/``ttt``.
        opponent: An opponent spec string or an :class:`Opponent`.
        seat: The agent's seat (0 = first to act).
        max_turns: Agent turns per episode (game default when ``None``).
    """
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
