"""Sokoban rooms: the rules of a move, a breadth-first solver and a room generator.

A room is a grid of walls and floor with targets on some floor cells, boxes and one
player. The player walks up, down, left or right onto free floor; walking into a box
pushes it one cell on if the cell behind it is free floor (no wall, no other box).
Boxes cannot be pulled, so a box pushed into a corner that is not a target stays there
for good (a *deadlock*: the room can no longer be solved). The room is solved when every
box stands on a target.

The generator guarantees that every room it returns can be solved within a move budget:

1. Draw the layout: a 6x6 grid whose outer ring is wall, with a few inner walls that
   keep the floor connected.
2. Put the boxes on distinct target cells (a solved room) and the player on free floor.
3. Play backwards: the player walks at random and, when a box lies behind it, may
   *pull* it along. Every backward step is the undo of a legal forward move, so the
   room this produces can always be pushed back to the solved one.
4. Keep the room only if no box starts on a target and the breadth-first solver's
   shortest solution has between ``min_moves`` and ``max_moves`` moves (by default 4 to
   21: no room is solved in one turn of 3 moves, every room fits in 7 such turns);
   otherwise try the next candidate drawn from the same seed.

Everything is a deterministic function of the seed.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import lru_cache

SIZE = 6
"""Rooms are SIZE x SIZE cells, outer wall included (4 x 4 inside)."""

MOVES: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}
"""The four moves as (row, column) offsets, in the order the solver tries them."""

Cell = tuple[int, int]
_State = tuple[int, frozenset[int]]  # (player, boxes) as integer cells, in the solver


@dataclass(frozen=True)
class Room:
    """One Sokoban position. Cells are (row, column) from 0, row 0 at the top.

    Attributes:
        height: Rows.
        width: Columns.
        walls: Wall cells.
        targets: Target cells.
        boxes: Box cells (as many as targets).
        player: The player's cell.
    """

    height: int
    width: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def solved(self) -> bool:
        """Every box stands on a target."""
        return self.boxes == self.targets

    @property
    def boxes_on_targets(self) -> int:
        return len(self.boxes & self.targets)

    def is_free(self, cell: Cell) -> bool:
        """Inside the grid, not a wall and not a box."""
        r, c = cell
        inside = 0 <= r < self.height and 0 <= c < self.width
        return inside and cell not in self.walls and cell not in self.boxes

    def blocked_reason(self, move: str) -> str:
        """Why ``move`` cannot be made here, or ``""`` when it can."""
        dr, dc = MOVES[move]
        r, c = self.player
        ahead = (r + dr, c + dc)
        if ahead in self.walls or not (0 <= ahead[0] < self.height and 0 <= ahead[1] < self.width):
            return "a wall is in the way"
        if ahead in self.boxes:
            beyond = (ahead[0] + dr, ahead[1] + dc)
            if beyond in self.boxes:
                return "the box cannot be pushed into another box"
            if not self.is_free(beyond):
                return "the box cannot be pushed into a wall"
        return ""

    def move(self, move: str) -> Room:
        """The room after ``move``; raises ``ValueError`` if it is blocked."""
        reason = self.blocked_reason(move)
        if reason:
            raise ValueError(f"cannot move {move}: {reason}")
        dr, dc = MOVES[move]
        ahead = (self.player[0] + dr, self.player[1] + dc)
        boxes = self.boxes
        if ahead in boxes:
            boxes = (boxes - {ahead}) | {(ahead[0] + dr, ahead[1] + dc)}
        return Room(self.height, self.width, self.walls, self.targets, boxes, ahead)

    def open_moves(self) -> list[str]:
        """The moves that are not blocked, in the order of :data:`MOVES`."""
        return [m for m in MOVES if not self.blocked_reason(m)]

    def stuck_boxes(self) -> list[Cell]:
        """Boxes off target wedged in a corner of walls: they can never move again.

        This is the simplest kind of deadlock; a room can be unsolvable in other ways
        too (the solver is the authority), but a cornered box is the one to point out.
        """
        stuck = []
        for r, c in sorted(self.boxes - self.targets):
            vertical = (r - 1, c) in self.walls or (r + 1, c) in self.walls
            horizontal = (r, c - 1) in self.walls or (r, c + 1) in self.walls
            if vertical and horizontal:
                stuck.append((r, c))
        return stuck

    # -- text ---------------------------------------------------------------------------

    def to_text(self) -> str:
        """The room in XSB notation, one line per row (``-`` for floor).

        ``#`` wall, ``-`` floor, ``.`` target, ``$`` box, ``*`` box on a target,
        ``@`` player, ``+`` player on a target.
        """
        rows = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell = (r, c)
                if cell in self.walls:
                    row.append("#")
                elif cell in self.boxes:
                    row.append("*" if cell in self.targets else "$")
                elif cell == self.player:
                    row.append("+" if cell in self.targets else "@")
                else:
                    row.append("." if cell in self.targets else "-")
            rows.append("".join(row))
        return "\n".join(rows)

    @classmethod
    def from_text(cls, text: str) -> Room:
        """Read a room written in XSB notation (``-``, ``_`` or a space for floor).

        Raises:
            ValueError: No player or several, no box, or unequal box and target counts.
        """
        lines = [line for line in text.strip("\n").split("\n")]
        height, width = len(lines), max(len(line) for line in lines)
        walls, targets, boxes, players = set(), set(), set(), []
        for r, line in enumerate(lines):
            for c, ch in enumerate(line.ljust(width)):
                if ch == "#":
                    walls.add((r, c))
                if ch in ".*+":
                    targets.add((r, c))
                if ch in "$*":
                    boxes.add((r, c))
                if ch in "@+":
                    players.append((r, c))
                if ch not in "#.*+$@-_ ":
                    raise ValueError(f"unknown room character {ch!r} at row {r}, column {c}")
        if len(players) != 1:
            raise ValueError(f"a room needs exactly one player (@ or +), found {len(players)}")
        if not boxes or len(boxes) != len(targets):
            raise ValueError(
                f"a room needs as many targets as boxes (at least one), "
                f"found {len(boxes)} boxes and {len(targets)} targets"
            )
        return cls(
            height, width, frozenset(walls), frozenset(targets), frozenset(boxes), players[0]
        )


# -- solver -------------------------------------------------------------------------------


def solve(room: Room, max_moves: int | None = None) -> list[str] | None:
    """A shortest solution (fewest moves) by breadth-first search, or ``None``.

    Args:
        room: The starting position.
        max_moves: Give up on solutions longer than this (``None``: no limit).

    Returns:
        The moves, ``[]`` for a solved room, or ``None`` when no solution of at most
        ``max_moves`` moves exists.
    """
    if room.solved:
        return []
    # Cells as integers r * stride + c keep the search state small and hashable; the
    # stride leaves one column that is never free, so no move wraps round a row's end.
    stride = room.width + 1
    free = {
        r * stride + c
        for r in range(room.height)
        for c in range(room.width)
        if (r, c) not in room.walls
    }
    targets = frozenset(r * stride + c for r, c in room.targets)
    steps = [(name, dr * stride + dc) for name, (dr, dc) in MOVES.items()]
    start: _State = (
        room.player[0] * stride + room.player[1],
        frozenset(r * stride + c for r, c in room.boxes),
    )
    parent: dict[_State, tuple[_State, str]] = {}
    frontier = deque([(start, 0)])
    while frontier:
        state, depth = frontier.popleft()
        if max_moves is not None and depth >= max_moves:
            continue
        player, boxes = state
        for name, delta in steps:
            ahead = player + delta
            if ahead not in free:
                continue
            if ahead in boxes:
                beyond = ahead + delta
                if beyond not in free or beyond in boxes:
                    continue
                next_boxes = (boxes - {ahead}) | {beyond}
            else:
                next_boxes = boxes
            nxt = (ahead, next_boxes)
            if nxt in parent or nxt == start:
                continue
            parent[nxt] = (state, name)
            if next_boxes == targets:
                path = []
                node = nxt
                while node != start:
                    node, move = parent[node]
                    path.append(move)
                return path[::-1]
            frontier.append((nxt, depth + 1))
    return None


# -- generator ----------------------------------------------------------------------------

MAX_ATTEMPTS = 1000


def _layout(rng: random.Random, size: int, inner_walls: int) -> frozenset[Cell]:
    """The outer ring plus up to ``inner_walls`` inner walls that keep the floor connected."""
    walls = {
        (r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)
    }
    inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    for cell in rng.sample(inner, len(inner)):
        if inner_walls == 0:
            break
        trial = walls | {cell}
        if _connected([x for x in inner if x not in trial]):
            walls, inner_walls = trial, inner_walls - 1
    return frozenset(walls)


def _connected(floor: list[Cell]) -> bool:
    if not floor:
        return False
    cells, seen, todo = set(floor), {floor[0]}, [floor[0]]
    while todo:
        r, c = todo.pop()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if nxt in cells and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return len(seen) == len(cells)


def _play_backwards(room: Room, rng: random.Random, steps: int) -> Room:
    """Random walk with pulls: each step undoes some legal forward move."""
    player, boxes = room.player, set(room.boxes)
    directions = list(MOVES.values())
    for _ in range(steps):
        dr, dc = rng.choice(directions)
        ahead = (player[0] + dr, player[1] + dc)
        if ahead in room.walls or ahead in boxes:
            continue
        behind = (player[0] - dr, player[1] - dc)
        # Pulling the box behind undoes a push in direction -d; not pulling undoes a walk.
        if behind in boxes and rng.random() < 0.8:
            boxes.remove(behind)
            boxes.add(player)
        player = ahead
    return Room(room.height, room.width, room.walls, room.targets, frozenset(boxes), player)


def _candidate(rng: random.Random, num_boxes: int, size: int) -> Room | None:
    walls = _layout(rng, size, inner_walls=rng.randint(0, 3))
    floor = [(r, c) for r in range(size) for c in range(size) if (r, c) not in walls]
    if len(floor) < num_boxes + 2:
        return None
    chosen = rng.sample(floor, num_boxes + 1)
    targets = frozenset(chosen[:num_boxes])
    solved = Room(size, size, walls, targets, targets, chosen[-1])
    return _play_backwards(solved, rng, steps=rng.randint(10, 40))


@lru_cache(maxsize=4096)
def generate_room(
    seed: int, num_boxes: int, max_moves: int = 21, min_moves: int = 4, size: int = SIZE
) -> Room:
    """A room whose shortest solution has ``min_moves`` to ``max_moves`` moves.

    Args:
        seed: Any integer; the same seed and settings always give the same room.
        num_boxes: Boxes (and targets), 1 to 4.
        max_moves: Longest allowed shortest solution (default 21 = 7 turns x 3 moves).
        min_moves: Shortest allowed shortest solution (default 4: more than one turn).
        size: Side of the square room, outer wall included.

    Raises:
        ValueError: Settings for which no room was found.
    """
    if not 1 <= num_boxes <= 4:
        raise ValueError(f"num_boxes must be 1 to 4, got {num_boxes}")
    if size < 4:
        raise ValueError(f"size must be at least 4, got {size}")
    if not 0 <= min_moves <= max_moves:
        raise ValueError(f"need 0 <= min_moves <= max_moves, got {min_moves} and {max_moves}")
    rng = random.Random(seed)
    for _ in range(MAX_ATTEMPTS):
        room = _candidate(rng, num_boxes, size)
        if room is None or room.boxes & room.targets:
            continue
        solution = solve(room, max_moves)
        if solution is not None and len(solution) >= min_moves:
            return room
    raise ValueError(
        f"found no {size}x{size} room with {num_boxes} boxes solvable in {min_moves} to "
        f"{max_moves} moves after {MAX_ATTEMPTS} tries; widen the range or use fewer boxes"
    )
