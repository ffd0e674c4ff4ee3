"""Tic-Tac-Toe: rendering, parsing and the opponents of SPEC §7.

OpenSpiel's ``tic_tac_toe``: action ``3 * row + col`` with 0-based row and column;
the first player is ``x``. The agent names cells as ``(row, col)`` from 1 to 3.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyspiel

from mage_rl.envs.openspiel_env import GameRules
from mage_rl.envs.opponents import Opponent, register_opponent_factory

# The grammar (docs/environments.md): two ASCII digits, separated by a comma or by spaces
# or tabs, optionally in parentheses; ASCII white space around. Unicode digits such as
# "２" and separators such as "\x0b" are refused rather than read by \d and \s.
_CELL = re.compile(r"[ \t\r\n]*\(?[ \t]*([0-9])[ \t]*(?:,|[ \t])[ \t]*([0-9])[ \t]*\)?[ \t\r\n]*")
MARKS = ("X", "O")


def cell_text(action: int) -> str:
    """``(row, col)`` from 1 to 3 for an action id."""
    return f"({action // 3 + 1}, {action % 3 + 1})"


def board_rows(state: pyspiel.State) -> list[str]:
    """The board as three strings of ``X``, ``O`` and ``.``."""
    return str(state).upper().split()[:3]


class TicTacToeRules(GameRules):
    """3x3 Tic-Tac-Toe as text."""

    game_name = "tic_tac_toe"
    invalid_penalty = 0.5
    length_penalty = 2.0
    # Five agent moves at most; three more for invalid answers.
    default_max_turns = 8

    def task_description(self, seat: int) -> str:
        order = "first" if seat == 0 else "second"
        return (
            "You are playing Tic-Tac-Toe on a 3x3 board against a fixed opponent.\n"
            "Players take turns marking an empty cell; three of your marks in a row, "
            "column or diagonal wins; a full board with no line is a draw. "
            "X moves first.\n"
            f"You play {MARKS[seat]} and move {order}.\n"
            "Cells are (row, col) with row and col from 1 to 3; (1, 1) is the top-left "
            "corner. Answer with one empty cell inside tags, for example "
            "<action>(2, 2)</action>."
        )

    def render(self, state: pyspiel.State, seat: int) -> str:
        rows = board_rows(state)
        lines = [f"You play {MARKS[seat]}. Board (row 1 at the top):"]
        lines.append("     1 2 3")
        for i, row in enumerate(rows):
            lines.append(f"  {i + 1}  " + " ".join(row))
        if not state.is_terminal():
            legal = ", ".join(cell_text(a) for a in state.legal_actions())
            lines.append(f"Empty cells: {legal}.")
        return "\n".join(lines)

    def action_text(self, state: pyspiel.State, player: int, action: int) -> str:
        return cell_text(action)

    def parse(self, text: str, state: pyspiel.State, seat: int) -> int | str:
        match = _CELL.fullmatch(text)
        if not match:
            return (
                f"could not read a cell from {text.strip()[:40]!r}; "
                "write (row, col) with row and col from 1 to 3"
            )
        row, col = int(match.group(1)), int(match.group(2))
        if not (1 <= row <= 3 and 1 <= col <= 3):
            return f"cell ({row}, {col}) is off the board; row and col go from 1 to 3"
        action = 3 * (row - 1) + (col - 1)
        if action not in state.legal_actions():
            return f"cell ({row}, {col}) is already taken"
        return action

    def describe_move(self, state: pyspiel.State, player: int, action: int, seat: int) -> str:
        who = "You" if player == seat else "Opponent"
        return f"{who} ({MARKS[player]}): {cell_text(action)}"


# -- opponents (SPEC §7) ---------------------------------------------------------------

PATTERNS: dict[str, tuple[int, ...]] = {
    "centre_first": (4, 0, 2, 6, 8, 1, 3, 5, 7),
    "corners_first": (0, 2, 6, 8, 4, 1, 3, 5, 7),
    "edges_first": (1, 3, 5, 7, 4, 0, 2, 6, 8),
    "diagonal": (0, 4, 8),
    "anti_diagonal": (2, 4, 6),
    "reversed": (8, 7, 6, 5, 4, 3, 2, 1, 0),
}
"""Priority lists of the preferred-pattern opponents (action ids, 0-based)."""


class RandomOpponent(Opponent):
    """Uniform over the empty cells."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def act(self, state: pyspiel.State, player: int) -> int:
        return int(self._rng.choice(state.legal_actions(player)))


class PatternOpponent(RandomOpponent):
    """Plays the first empty cell of a priority list, random once none is left."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        if pattern not in PATTERNS:
            raise ValueError(f"unknown pattern {pattern!r}; valid: {', '.join(PATTERNS)}")
        self.priority = PATTERNS[pattern]

    def act(self, state: pyspiel.State, player: int) -> int:
        legal = set(state.legal_actions(player))
        for action in self.priority:
            if action in legal:
                return action
        return super().act(state, player)


class MCTSOpponent(Opponent):
    """OpenSpiel's C++ MCTS bot: UCT c=1.4, one random rollout per leaf, solver on."""

    def __init__(self, simulations: int, uct_c: float = 1.4) -> None:
        if simulations < 1:
            raise ValueError(f"MCTS needs at least one simulation, got {simulations}")
        self.simulations = simulations
        self.uct_c = uct_c
        self._game = pyspiel.load_game("tic_tac_toe")
        self.reset(0)

    def reset(self, seed: int) -> None:
        # The C++ bot takes 32-bit seeds.
        seed32 = seed % (2**31 - 1)
        evaluator = pyspiel.RandomRolloutEvaluator(1, seed32)
        self._bot = pyspiel.MCTSBot(
            self._game, evaluator, self.uct_c, self.simulations, 1000, True, seed32, False
        )

    def act(self, state: pyspiel.State, player: int) -> int:
        return int(self._bot.step(state))


def _random_factory(args: Sequence[str]) -> Opponent:
    if args:
        raise ValueError(f"ttt:random takes no arguments, got {list(args)}")
    return RandomOpponent()


def _pattern_factory(args: Sequence[str]) -> Opponent:
    if len(args) != 1:
        raise ValueError(f"write ttt:pattern:NAME with NAME one of {', '.join(PATTERNS)}")
    return PatternOpponent(args[0])


def _mcts_factory(args: Sequence[str]) -> Opponent:
    if len(args) != 1 or not args[0].isdigit():
        raise ValueError("write ttt:mcts:N with N the number of simulations, e.g. ttt:mcts:100")
    return MCTSOpponent(int(args[0]))


def register_opponents() -> None:
    """Register the Tic-Tac-Toe opponents (SPEC §7); called by :mod:`mage_rl.envs.builtins`."""
    register_opponent_factory("tic_tac_toe", "random", _random_factory, "tic_tac_toe:random")
    register_opponent_factory(
        "tic_tac_toe",
        "pattern",
        _pattern_factory,
        "tic_tac_toe:pattern:{" + "|".join(PATTERNS) + "}",
    )
    register_opponent_factory("tic_tac_toe", "mcts", _mcts_factory, "tic_tac_toe:mcts:N")
