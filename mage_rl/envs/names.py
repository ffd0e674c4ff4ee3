"""Names of the registered environments: the registry's entries and how to look them up.

Kept apart from :mod:`mage_rl.envs.registry` (which builds environments, and so needs
the OpenSpiel adapter and the opponents) so that the opponents can check the game of a
spec without importing what builds games.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mage_rl.registry import Registry

if TYPE_CHECKING:
    from mage_rl.envs.base import TextEnv
    from mage_rl.envs.openspiel_env import GameRules

EnvFactory = Callable[[Any, int, "int | None"], "TextEnv"]
"""``factory(opponent, seat, max_turns) -> TextEnv``; ``opponent`` is the spec string
(or an :class:`~mage_rl.envs.opponents.Opponent` built from it), ``max_turns`` ``None``
for the task's default."""


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment.

    Attributes:
        name: Canonical name (for OpenSpiel games, the OpenSpiel game name).
        factory: Builds the environment for one opponent (or task variant) and seat.
        rules: The game's rules for OpenSpiel games (``None`` for other environments);
            oracles and the matchup tools need them.
        seats: Seats the agent may take: 2 for two-player games, 1 for single-agent
            tasks, whose "opponent" names a task variant.
        invalid_penalty: ``c_inv`` of SPEC §3, the default of ``returns.invalid_penalty``.
        length_penalty: ``c_len`` of SPEC §3, the default of ``returns.length_penalty``.
        gamma_traj: Default discount across episodes (0.6 for the games, 0.9 for
            Sokoban), the default of ``returns.gamma_traj``.
    """

    name: str
    factory: EnvFactory
    rules: GameRules | None = None
    seats: int = 2
    invalid_penalty: float = 0.5
    length_penalty: float = 2.0
    gamma_traj: float = 0.6

    @property
    def single_agent(self) -> bool:
        return self.seats == 1


ENVS: Registry[EnvSpec] = Registry("environment")


def canonical_game(name: str) -> str:
    """The registered name of an environment name or alias (``kuhn`` -> ``kuhn_poker``).

    Raises:
        ValueError: Nothing is registered under ``name``; the message lists what is.
    """
    return ENVS.canonical(name)


def env_spec(name: str) -> EnvSpec:
    """The :class:`EnvSpec` of an environment name or alias."""
    return ENVS.get(name)


def env_names() -> list[str]:
    """Registered environment names."""
    return ENVS.names()


class LiveNames:
    """A read-only, always current view of registered environment names.

    Lets older code keep ``if name in ENV_NAMES`` and ``", ".join(ENV_NAMES)`` while
    plugins add environments after import.
    """

    def __init__(self, single_agent_only: bool = False) -> None:
        self._single = single_agent_only

    def _names(self) -> list[str]:
        return [n for n in ENVS.names() if not self._single or ENVS.get(n).single_agent]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in ENVS and name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def __repr__(self) -> str:
        return repr(tuple(self._names()))


GAME_SHORT = {
    "kuhn_poker": "kuhn",
    "tic_tac_toe": "ttt",
    "sokoban": "sokoban",
    "leduc_poker": "leduc",
    "textworld_express": "twx",
    "rock_paper_scissors": "rps",
}
