"""Sokoban, the single-agent exploration task of SPEC §7, as a text environment.

The agent pushes every box of a 6x6 room (outer wall included) onto a target. Each
turn it writes one to three moves inside the action tag, ``<action>up, left,
left</action>``; an episode allows 7 turns. Rooms come from
:func:`~mage_rl.envs.sokoban_room.generate_room`, which guarantees a solution of 4 to 21
moves, and are fixed by the episode seed: under the ``replay`` protocol every episode of
a meta-episode restarts the same room, under ``fresh`` each episode gets its own.

Rewards (SPEC §3): a solved room is a win (+10). Sokoban has no losing position, so an
episode that runs out of turns is ``unfinished`` (0), a failure for success@k. A turn is
*invalid* (penalty ``c_inv`` = 0.5, room unchanged, the turn still counts) when the tag
is missing or empty, a part of it is not a move, it holds more than three moves, or one
of its moves is blocked (a wall, or a box that cannot be pushed). The turn is checked
as a whole before anything moves, so an invalid turn never changes the room; the reason
names the offending part.

There is no opponent. To fit the rest of the library, which groups, samples and reports
tasks by an *opponent spec*, the spec names the room variant instead:
``sokoban:boxes:N`` with N = 1, 2 or 3. The presets are ``sokoban_train`` (2 boxes, as
in the paper's training) and ``sokoban_unseen`` (1 and 3 boxes, equal weights).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mage_rl.envs.base import (
    NO_ACTION_TAG,
    WIN_REWARD,
    StepResult,
    TaskText,
    TextEnv,
    Wording,
    derive_seed,
)
from mage_rl.envs.opponents import Opponent, make_opponent, register_opponent_factory
from mage_rl.envs.sokoban_room import MOVES, Cell, Room, generate_room

NAME = "sokoban"
BOX_COUNTS = (1, 2, 3)
"""Box counts a variant may have (2 for training; 1 and 3 unseen)."""
MAX_MOVES_PER_TURN = 3
DEFAULT_MAX_TURNS = 7
MAX_SOLUTION_MOVES = MAX_MOVES_PER_TURN * DEFAULT_MAX_TURNS
"""Every room can be solved within this many moves (7 turns of 3 moves)."""
INVALID_PENALTY = 0.5
LENGTH_PENALTY = 1.0

LEGEND = "Legend: # wall, - floor, . target, $ box, * box on a target, @ you, + you on a target."
_SPLIT = re.compile(r"[ \t\r\n,;>|/\-\u2192]+|\bthen\b|\band\b", re.IGNORECASE | re.ASCII)

WORDING = Wording(
    same_task=(
        "You play several episodes in a row. Each starts from the room shown at its "
        "start, often the same room again. Use what earlier episodes taught you to solve "
        "the room in the later ones."
    ),
    setting="of this task",
    reflect_focus="which moves wasted turns or pushed a box where it got stuck",
)


def cell_text(cell: Cell) -> str:
    """``(row, col)`` counted from 1, row 1 at the top, as the rendering numbers them."""
    return f"({cell[0] + 1}, {cell[1] + 1})"


def render(room: Room) -> str:
    """The agent's observation: a summary line, the numbered grid and the legend.

    The first line summarises the position, so a one-line view of an episode (the
    ``history`` context) still shows where everything was.
    """
    boxes = ", ".join(cell_text(b) for b in sorted(room.boxes))
    targets = ", ".join(cell_text(t) for t in sorted(room.targets))
    lines = [
        f"You are at {cell_text(room.player)}; boxes at {boxes}; targets at {targets}; "
        f"{room.boxes_on_targets} of {len(room.boxes)} boxes on targets.",
        "Room (row 1 at the top, column 1 at the left):",
        "     " + " ".join(str(c + 1) for c in range(room.width)),
    ]
    for r, row in enumerate(room.to_text().split("\n")):
        lines.append(f"  {r + 1}  " + " ".join(row))
    lines.append(LEGEND)
    if room.solved:
        lines.append("Every box is on a target: the room is solved.")
    else:
        lines.append("Moves not blocked now: " + ", ".join(room.open_moves()) + ".")
    return "\n".join(lines)


def parse_moves(text: str) -> list[str] | str:
    """Read one to three moves from the action tag's content.

    The grammar (docs/environments.md): moves are ``up``, ``down``, ``left`` and
    ``right`` in ASCII letters of any case, separated by commas, semicolons, spaces,
    ``then``, ``and`` or arrows (``->``, ``>``, ``\u2192``); the whole list may sit in
    square brackets and end with ``.`` or ``!``. Anything else (parentheses, quotes,
    Unicode look-alike letters) makes the turn invalid.

    Returns:
        The moves, or why the text is not a valid turn.
    """
    body = text.strip(" \t\r\n").rstrip(".!")
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    parts = [p.lower() if p.isascii() else p for p in _SPLIT.split(body) if p]
    if not parts:
        return "the action is empty; write one to three moves such as <action>up, left</action>"
    unknown = [p for p in parts if p not in MOVES]
    if unknown:
        shown = ", ".join(repr(p[:20]) for p in unknown[:3])
        return f"{shown} {'is not a move' if len(unknown) == 1 else 'are not moves'}; moves are up, down, left, right"
    if len(parts) > MAX_MOVES_PER_TURN:
        return f"{len(parts)} moves given; at most {MAX_MOVES_PER_TURN} moves per turn"
    return parts


def check_turn(room: Room, moves: Sequence[str]) -> tuple[list[Room], str]:
    """Play ``moves`` from ``room`` without committing them.

    Returns:
        The rooms after each move, and ``""``, or ``[]`` and why move i is blocked.
        Moves after the room is solved are not played.
    """
    rooms: list[Room] = []
    current = room
    for i, move in enumerate(moves):
        if current.solved:
            break
        reason = current.blocked_reason(move)
        if reason:
            where = f"move {i + 1} ({move})" if len(moves) > 1 else f"{move}"
            return [], f"{where} is blocked: {reason}; no move of this turn was made"
        current = current.move(move)
        rooms.append(current)
    return rooms, ""


class SokobanVariant(Opponent):
    """The room variant a task uses, standing where the games have an opponent.

    It never plays a move; its ``spec`` (``sokoban:boxes:N``) is the id that groups,
    anchors and per-variant metrics use, as opponent ids do for the games.
    """

    def __init__(self, num_boxes: int) -> None:
        if num_boxes not in BOX_COUNTS:
            raise ValueError(f"Sokoban rooms have {BOX_COUNTS} boxes, not {num_boxes}")
        self.num_boxes = num_boxes
        self.spec = f"{NAME}:boxes:{num_boxes}"

    def act(self, state: object, player: int) -> int:
        raise RuntimeError("a Sokoban variant names a kind of room; it plays no moves")


def _boxes_factory(args: Sequence[str]) -> Opponent:
    if len(args) != 1 or not args[0].isdigit() or int(args[0]) not in BOX_COUNTS:
        raise ValueError(
            f"write sokoban:boxes:N with N one of {', '.join(map(str, BOX_COUNTS))}, "
            f"got sokoban:boxes{''.join(':' + a for a in args)}"
        )
    return SokobanVariant(int(args[0]))


def register_opponents() -> None:
    """Register the Sokoban room variants; called by :mod:`mage_rl.envs.builtins`."""
    register_opponent_factory(NAME, "boxes", _boxes_factory, "sokoban:boxes:{1|2|3}")


class SokobanEnv(TextEnv):
    """Sokoban rooms as a text environment.

    Args:
        num_boxes: Boxes per room (1, 2 or 3).
        max_turns: Turns per episode, invalid ones included (default 7).
    """

    def __init__(self, num_boxes: int = 2, max_turns: int | None = None) -> None:
        self.variant = SokobanVariant(num_boxes)
        self.num_boxes = num_boxes
        self.name = NAME
        self.seat = 0
        self.max_turns = max_turns or DEFAULT_MAX_TURNS
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        self.invalid_penalty = INVALID_PENALTY
        self.length_penalty = LENGTH_PENALTY
        self.room: Room | None = None
        self.turns = 0
        self.moves_made = 0
        self.done = True
        self._initial_observation = ""
        self._transcript: list[str] = []

    def reset(self, seed: int) -> str:
        self.room = generate_room(
            derive_seed(NAME, "room", seed), self.num_boxes, max_moves=MAX_SOLUTION_MOVES
        )
        self.turns = 0
        self.moves_made = 0
        self.done = False
        self._transcript = []
        self._initial_observation = render(self.room)
        return self._initial_observation

    def step(self, response: str) -> StepResult:
        info, content = self._start_step(response, started=self.room is not None)
        parsed = parse_moves(content) if content is not None else NO_ACTION_TAG
        rooms: list[Room] = []
        if isinstance(parsed, list):
            rooms, reason = check_turn(self.room, parsed)
        else:
            reason = parsed
        if reason:
            info.invalid, info.invalid_reason = True, reason
        else:
            made = parsed[: len(rooms)]
            pushes = sum(
                a.boxes != b.boxes for a, b in zip([self.room, *rooms], rooms, strict=False)
            )
            info.action = ", ".join(made)
            line = f"You: {info.action}"
            if pushes:
                line += f" ({pushes} push{'es' if pushes > 1 else ''})"
            self.room = rooms[-1]
            self.moves_made += len(made)
            self._transcript.append(line)
            info.events.append(line)

        reward = 0.0
        if self.room.solved:
            reward, info.outcome, self.done = WIN_REWARD, "won", True
            info.feedback = (
                f"Solved: every box is on a target after {self.moves_made} moves in "
                f"{self.turns} turns."
            )
        elif self.turns >= self.max_turns:
            info.outcome, self.done = "unfinished", True
            info.feedback = (
                f"Out of turns ({self.max_turns}): {self.room.boxes_on_targets} of "
                f"{self.num_boxes} boxes on targets."
            )
            stuck = self.room.stuck_boxes()
            if stuck:
                cells = ", ".join(cell_text(c) for c in stuck)
                info.feedback += f" Stuck in a corner off target, for good: box at {cells}."
        if self.done:
            info.extra = {
                "room": self.room.to_text(),
                "boxes_on_targets": self.room.boxes_on_targets,
                "moves": self.moves_made,
                "stuck_boxes": [list(c) for c in self.room.stuck_boxes()],
            }
        return StepResult(render(self.room), reward, self.done, info)

    def legal_actions(self) -> list[str]:
        """The single moves that are not blocked (any one to three of them, in an order
        that stays unblocked, make a valid turn)."""
        if self.room is None or self.done:
            return []
        return self.room.open_moves()

    @property
    def task_description(self) -> str:
        text = (
            "You are playing Sokoban. Push every box onto a target.\n"
            "Rules: you move up, down, left or right onto free floor. Walking into a box "
            "pushes it one cell on, if the cell behind it is free floor; a box cannot be "
            "pushed into a wall or another box, and boxes cannot be pulled. A box pushed "
            "into a corner that is not a target can never move again. The room is solved "
            "when every box is on a target.\n"
            f"Each turn, write one to {MAX_MOVES_PER_TURN} moves inside tags, for "
            "example <action>up, left, left</action>. They are made in order. If any "
            "move is blocked or is not a move, the whole turn is invalid and nothing "
            f"moves. You have {self.max_turns} turns.\n"
            "Cells are (row, col) counted from 1; row 1 is the top row, col 1 the left "
            "column; up decreases the row, left decreases the column."
        )
        return TaskText(text, WORDING)

    @property
    def brief_description(self) -> str:
        """The rules in two lines, for short prompts."""
        return TaskText(
            "Sokoban: push every box onto a target; boxes cannot be pulled. "
            f"Write 1 to {MAX_MOVES_PER_TURN} moves, e.g. <action>up, left</action>; "
            f"a blocked move voids the turn. {self.max_turns} turns.",
            WORDING,
        )


def make_sokoban_env(
    variant: str | Opponent, seat: int = 0, max_turns: int | None = None
) -> SokobanEnv:
    """Build a Sokoban environment for a variant spec such as ``sokoban:boxes:2``.

    Raises:
        ValueError: A spec of another task, an unknown variant, or a seat other than 0.
    """
    if seat != 0:
        raise ValueError(
            f"Sokoban is a single-agent task; its only seat is 0 (first), got {seat}. "
            "Set env.seat: first (mage eval uses the first seat for it by itself)"
        )
    if isinstance(variant, str):
        variant = make_opponent(variant)  # checks the spec and lists the valid ones
    if not isinstance(variant, SokobanVariant):
        raise ValueError(f"{variant!r} is not a Sokoban variant; write sokoban:boxes:N")
    return SokobanEnv(variant.num_boxes, max_turns=max_turns)
