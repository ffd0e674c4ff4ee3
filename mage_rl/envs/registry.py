"""The environment registry: every task ``make_env``, configs and commands can name.

An environment is registered once, under a name and aliases, either as an OpenSpiel
game plus its :class:`~mage_rl.envs.openspiel_env.GameRules` (the shared adapter does the
rest) or as a factory of any :class:`~mage_rl.envs.base.TextEnv`. The entry also carries
the task's SPEC §3 constants (invalid-action and length penalties) and its cross-episode
discount, which training uses when a config leaves them out::

    from mage_rl.envs import register_env

    register_env("pennies", rules=MatchingPenniesRules(), aliases=("matching_pennies",))
    register_env("maze", factory=lambda opponent, seat, max_turns: MazeEnv(opponent),
                 seats=1, invalid_penalty=0.5, length_penalty=1.0, gamma_traj=0.9)

The built-in games register themselves in :mod:`mage_rl.envs.builtins`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mage_rl.envs.llm_opponent import register_llm_opponent
from mage_rl.envs.names import (
    ENVS,
    EnvFactory,
    EnvSpec,
    LiveNames,
    canonical_game,
    env_names,
    env_spec,
)
from mage_rl.envs.openspiel_env import OpenSpielEnv
from mage_rl.envs.opponents import make_opponent

if TYPE_CHECKING:
    from mage_rl.envs.base import TextEnv
    from mage_rl.envs.openspiel_env import GameRules
    from mage_rl.envs.opponents import Opponent

__all__ = [
    "ENVS",
    "EnvFactory",
    "EnvSpec",
    "LiveNames",
    "canonical_game",
    "env_names",
    "env_spec",
    "make_env",
    "register_env",
    "seat_problem",
]


def register_env(
    name: str,
    factory: EnvFactory | None = None,
    *,
    rules: GameRules | None = None,
    aliases: tuple[str, ...] = (),
    seats: int | None = None,
    invalid_penalty: float | None = None,
    length_penalty: float | None = None,
    gamma_traj: float = 0.6,
    replace: bool = False,
) -> EnvSpec:
    """Register an environment under ``name`` (and ``aliases``).

    Give exactly one of ``factory`` (any :class:`TextEnv`) and ``rules`` (an OpenSpiel
    game through the shared adapter; opponents are then registered for ``name`` with
    :func:`~mage_rl.envs.opponents.register_opponent`).

    Args:
        name: The name configs and commands use (``env.name``, ``--env``), and the prefix
            of the environment's opponent specs (``NAME:OPPONENT``).
        factory: ``factory(opponent, seat, max_turns) -> TextEnv``.
        rules: Rules of an OpenSpiel game; the game is ``rules.game_name``.
        aliases: Other accepted names.
        seats: 2 for two-player games (default with ``rules``), 1 for single-agent tasks
            (default with ``factory``).
        invalid_penalty: ``c_inv``; default ``rules.invalid_penalty``, else 0.5.
        length_penalty: ``c_len``; default ``rules.length_penalty``, else 2.0.
        gamma_traj: Default cross-episode discount for this task.
        replace: Replace an entry registered under the same name.

    Returns:
        The registered :class:`EnvSpec`.

    Raises:
        ValueError: Both or neither of ``factory`` and ``rules``, a bad number of seats,
            or a taken name.
    """
    if (factory is None) == (rules is None):
        raise ValueError(
            f"register_env({name!r}): give exactly one of factory= (a TextEnv factory) "
            "and rules= (GameRules of an OpenSpiel game)"
        )
    if rules is not None:
        game_rules = rules

        def build(opponent: Any, seat: int, max_turns: int | None) -> TextEnv:
            if isinstance(opponent, str):
                opponent = make_opponent(opponent)
            return OpenSpielEnv(game_rules, opponent, seat=seat, max_turns=max_turns)

        factory = build
        seats = 2 if seats is None else seats
        invalid_penalty = rules.invalid_penalty if invalid_penalty is None else invalid_penalty
        length_penalty = rules.length_penalty if length_penalty is None else length_penalty
    seats = 1 if seats is None else seats
    if seats not in (1, 2):
        raise ValueError(f"register_env({name!r}): seats must be 1 or 2, got {seats}")
    spec = EnvSpec(
        name=name,
        factory=factory,
        rules=rules,
        seats=seats,
        invalid_penalty=0.5 if invalid_penalty is None else float(invalid_penalty),
        length_penalty=2.0 if length_penalty is None else float(length_penalty),
        gamma_traj=float(gamma_traj),
    )
    game = rules.game_name if rules is not None else ""
    # The OpenSpiel name is an alias too, when it is a plain name (not "game(params)").
    if game and game != name and game not in aliases and game.isidentifier():
        aliases = (*aliases, game)
    registered = ENVS.register(name, spec, aliases=aliases, replace=replace)
    if rules is not None and seats == 2:
        register_llm_opponent(name)  # GAME:llm:RUN_OR_MODEL (mage_rl.envs.llm_opponent)
    return registered


def seat_problem(name: str, seat: str) -> str | None:
    """Why ``env.seat`` cannot be played in environment ``name``, or ``None``.

    A single-agent task has seat ``first`` only; a game whose rules name their
    ``agent_seats`` (the showdown's answerer) allows those only.
    """
    spec = env_spec(name)
    names = {0: ("first", "0"), 1: ("second", "1")}
    allowed = (0,) if spec.single_agent else tuple(getattr(spec.rules, "agent_seats", (0, 1)))
    if allowed == (0, 1) or any(seat in names[i] for i in allowed):
        return None
    where = " or ".join(names[i][0] for i in allowed)
    if spec.single_agent:
        return (
            f"env.name={spec.name} is a single-agent task with one seat, but env.seat="
            f"{seat!r}; set env.seat: first"
        )
    return (
        f"env.name={spec.name}: the agent plays seat {where} only, but env.seat={seat!r}; "
        f"set env.seat: {where}"
    )


def make_env(
    game: str,
    opponent: str | Opponent,
    seat: int = 0,
    max_turns: int | None = None,
) -> TextEnv:
    """Build a text environment against one opponent (or of one task variant).

    Args:
        game: A registered environment name or alias (``kuhn_poker``/``kuhn``,
            ``tic_tac_toe``/``ttt``, ``sokoban``, or a plugin's).
        opponent: An opponent spec string (``GAME:NAME[:ARG]``) or an :class:`Opponent`;
            for a single-agent task a variant such as ``sokoban:boxes:2``.
        seat: The agent's seat (0 = first to act; single-agent tasks have only seat 0).
        max_turns: Agent turns per episode (task default when ``None``).

    Raises:
        ValueError: An unknown environment, or an opponent of another environment.
    """
    spec = env_spec(game)
    if isinstance(opponent, str):
        prefix = opponent.split(":")[0]
        if prefix not in ENVS or canonical_game(prefix) != spec.name:
            raise ValueError(f"opponent {opponent!r} does not play {spec.name}")
    return spec.factory(opponent, seat, max_turns)
