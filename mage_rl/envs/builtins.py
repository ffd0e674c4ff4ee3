"""The built-in environments and opponents, registered in one place.

Kuhn Poker, Tic-Tac-Toe, Leduc Hold'em, Liar's Dice, rock-paper-scissors and the showdown are
OpenSpiel games through the
shared adapter; Sokoban, ScienceWorld and TextWorld-Express are single-agent tasks whose
"opponents" are task variants. Their SPEC §3 constants (penalties) come from their rules;
the cross-episode discount is 0.6 for the games and 0.9 for the single-agent tasks
(SPEC §4). Plugins register theirs the same way (:func:`register_env`,
:func:`~mage_rl.envs.opponents.register_opponent`).
"""

from __future__ import annotations

from mage_rl.envs import (
    kuhn,
    leduc,
    liars_dice,
    rps,
    sciworld,
    showdown,
    sokoban,
    textworlds,
    tictactoe,
    twx,
)
from mage_rl.envs.registry import ENVS, register_env

_DONE = False


def register_builtins() -> None:
    """Register the built-in environments and their opponents (once)."""
    global _DONE
    if _DONE or "kuhn_poker" in ENVS:
        _DONE = True
        return
    _DONE = True
    register_env("kuhn_poker", rules=kuhn.KuhnRules(), aliases=("kuhn",), gamma_traj=0.6)
    register_env(
        "tic_tac_toe",
        rules=tictactoe.TicTacToeRules(),
        aliases=("ttt", "tictactoe"),
        gamma_traj=0.6,
    )
    register_env("leduc_poker", rules=leduc.LeducRules(), aliases=("leduc",), gamma_traj=0.6)
    register_env(
        "liars_dice", rules=liars_dice.LiarsDiceRules(), aliases=("liars",), gamma_traj=0.6
    )
    register_env(rps.GAME, rules=rps.RockPaperScissorsRules(), aliases=("rps",), gamma_traj=0.6)
    # gamma_traj 1: the showdown exists to test the final-episode objective itself (SPEC §11).
    register_env(showdown.GAME, rules=showdown.ShowdownRules(), gamma_traj=1.0)
    register_env(
        "sokoban",
        factory=sokoban.make_sokoban_env,
        seats=1,
        invalid_penalty=sokoban.INVALID_PENALTY,
        length_penalty=sokoban.LENGTH_PENALTY,
        gamma_traj=0.9,
    )
    # The text worlds register without their packages (the optional extra): these are
    # imported when an environment first starts its simulator.
    for module, factory in ((sciworld, sciworld.make_scienceworld_env), (twx, twx.make_twx_env)):
        register_env(
            module.NAME,
            factory=factory,
            aliases=module.ALIASES,
            seats=1,
            invalid_penalty=textworlds.INVALID_PENALTY,
            length_penalty=textworlds.LENGTH_PENALTY,
            gamma_traj=textworlds.GAMMA_TRAJ,
        )
    kuhn.register_opponents()
    tictactoe.register_opponents()
    leduc.register_opponents()
    liars_dice.register_opponents()
    rps.register_opponents()
    showdown.register_opponents()
    sokoban.register_opponents()
    sciworld.register_opponents()
    twx.register_opponents()
