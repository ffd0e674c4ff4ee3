"""Liar's Dice: rendering, parsing, scoring and opponent archetypes.

OpenSpiel's ``liars_dice`` with its default parameters: two players, one die each, six
sides, and the ``reset-face`` bidding rule. A bid ``Q-F`` claims that at least Q of the
two dice show face F; a six is wild and counts for every face (a bid on sixes counts
only sixes). Each bid must be higher than the last: a larger quantity with any face, or
the same quantity with a larger face. Instead of bidding, a player may call LIAR on the
last bid: both dice are shown, and if the bid holds the caller loses, otherwise the
bidder loses. Action ids: ``(Q - 1) * 6 + (F - 1)`` for bids, 12 for LIAR; the two chance
actions deal the dice (face = id + 1).

A won game pays +10 and a lost one -10 (SPEC §3); there are no draws.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyspiel

from mage_rl.envs.base import LOSS_REWARD, WIN_REWARD
from mage_rl.envs.openspiel_env import FinalScore, GameRules
from mage_rl.envs.opponents import (
    Opponent,
    Population,
    register_opponent_factory,
    register_population,
)
from mage_rl.envs.policy_opponents import UniformRandomOpponent

SIDES = 6
DICE = 2  # one die per player
WILD = SIDES
LIAR = DICE * SIDES
_BID = re.compile(r"^(\d+)-(\d+)$")


def bid_of(action: int) -> tuple[int, int]:
    """``(quantity, face)`` of a bid action id."""
    return action // SIDES + 1, action % SIDES + 1


def bid_action(quantity: int, face: int) -> int:
    return (quantity - 1) * SIDES + (face - 1)


def action_word(action: int) -> str:
    if action == LIAR:
        return "LIAR"
    quantity, face = bid_of(action)
    return f"{quantity}-{face}"


def die_of(state: pyspiel.State, player: int) -> int:
    """The face (1-6) of ``player``'s die."""
    return int(state.history()[player]) + 1


def bids(state: pyspiel.State) -> list[int]:
    """The actions after the deal: bids, and LIAR at the end of a finished game."""
    return [int(a) for a in state.history()[2:]]


def counts(face: int, dice: Sequence[int]) -> int:
    """How many of ``dice`` count toward a bid on ``face`` (sixes are wild)."""
    return sum(1 for d in dice if d in (face, WILD))


def _spoken(quantity: int, face: int) -> str:
    noun = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}[face]
    plural = "es" if noun == "six" and quantity != 1 else "s" if quantity != 1 else ""
    return f"{'one' if quantity == 1 else 'two'} {noun}{plural}"


class LiarsDiceRules(GameRules):
    """Liar's Dice, one die each, as text."""

    game_name = "liars_dice"
    payoff_unit = "payoff per game (+1 win, -1 loss)"
    invalid_penalty = 0.5
    length_penalty = 2.0
    # A game has at most 13 moves, so at most 7 agent decisions; 3 more for invalid ones.
    default_max_turns = 10

    def task_description(self, seat: int) -> str:
        you = "Player 1 (you bid first)" if seat == 0 else "Player 2 (you bid second)"
        return (
            "You are playing Liar's Dice against a fixed opponent.\n"
            "Rules: each player rolls one six-sided die and sees only their own. Players "
            "take turns. A bid Q-F claims that at least Q of the two dice show face F; a "
            "6 is wild and counts as every face (a bid on 6 counts only sixes). Each bid "
            "must be higher than the last: a larger quantity with any face, or the same "
            "quantity with a larger face (so 1-1 < 1-2 < ... < 1-6 < 2-1 < ... < 2-6). "
            "Instead of bidding you may call LIAR on the last bid: both dice are shown; "
            "if the bid holds, the caller loses, otherwise the bidder loses. The first "
            "move must be a bid.\n"
            f"You are {you}.\n"
            "Answer with exactly one action inside tags: a bid written quantity-face, "
            "for example <action>1-4</action> (at least one four), or <action>LIAR</action>."
        )

    def brief_description(self, seat: int) -> str:
        return f"Liar's dice (1 die each, 6 wild) as P{seat + 1}"

    def _history(self, state: pyspiel.State, seat: int, you: str, them: str) -> str:
        moves = bids(state)
        if not moves:
            return "none"
        # Player 0 makes the first bid, then the players alternate.
        who = (you if i % 2 == seat else them for i in range(len(moves)))
        return ", ".join(f"{w} {action_word(a)}" for w, a in zip(who, moves, strict=True))

    def brief_render(self, state: pyspiel.State, seat: int) -> str:
        return f"die {die_of(state, seat)}, bids: {self._history(state, seat, 'you', 'opp')}"

    def brief_summary(self, state: pyspiel.State, seat: int) -> str:
        return (
            f"die {die_of(state, seat)}, {self._history(state, seat, 'you', 'opp')}, "
            f"opp die {die_of(state, 1 - seat)}, {float(state.returns()[seat]):+g}"
        )

    def render(self, state: pyspiel.State, seat: int) -> str:
        lines = [f"Your die: {die_of(state, seat)} (6 is wild)."]
        lines.append(f"Bids so far: {self._history(state, seat, 'you', 'opponent')}.")
        moves = [a for a in bids(state) if a != LIAR]
        if not state.is_terminal():
            if moves:
                q, f = bid_of(moves[-1])
                lines.append(f"Current bid: {q}-{f} (at least {_spoken(q, f)}).")
            else:
                lines.append("No bid yet: you must open with a bid.")
            legal = [action_word(a) for a in state.legal_actions()]
            lines.append(f"Legal actions: {', '.join(legal)}.")
        return "\n".join(lines)

    def action_text(self, state: pyspiel.State, player: int, action: int) -> str:
        return action_word(action)

    def parse(self, text: str, state: pyspiel.State, seat: int) -> int | str:
        word = text.strip().rstrip(".!").upper().replace(" ", "")
        legal = state.legal_actions()
        if word == "LIAR":
            if LIAR not in legal:
                return "there is no bid to call LIAR on yet; open with a bid such as 1-3"
            return LIAR
        match = _BID.match(word)
        if not match:
            return (
                f"{text.strip()[:40]!r} is not an action; write a bid as quantity-face "
                "(for example 1-4) or LIAR"
            )
        quantity, face = int(match.group(1)), int(match.group(2))
        if not 1 <= quantity <= DICE:
            return f"there are only {DICE} dice; the quantity must be 1 or 2"
        if not 1 <= face <= SIDES:
            return f"a die has faces 1 to {SIDES}; {face} is not one"
        action = bid_action(quantity, face)
        if action not in legal:
            last = action_word([a for a in bids(state) if a != LIAR][-1])
            return (
                f"{quantity}-{face} does not raise the current bid {last}: bid a larger "
                "quantity, or the same quantity with a larger face, or call LIAR"
            )
        return action

    def describe_move(self, state: pyspiel.State, player: int, action: int, seat: int) -> str:
        who = "You" if player == seat else "Opponent"
        return f"{who}: {action_word(action)}"

    def score(self, state: pyspiel.State, seat: int) -> FinalScore:
        won = state.returns()[seat] > 0
        moves = bids(state)
        quantity, face = bid_of(moves[-2])
        mine, theirs = die_of(state, seat), die_of(state, 1 - seat)
        caller = (len(moves) - 1) % 2
        counted = counts(face, (mine, theirs))
        held = counted >= quantity
        who = "You" if caller == seat else "The opponent"
        dice = "die counts" if counted == 1 else "dice count"
        feedback = (
            f"{who} called LIAR on {quantity}-{face}. Dice: yours {mine}, the opponent's "
            f"{theirs}; {counted} {dice} toward {face}, so the bid "
            f"{'holds' if held else 'fails'}. You {'won' if won else 'lost'}."
        )
        extra = {"agent_die": mine, "opponent_die": theirs, "bid": f"{quantity}-{face}"}
        if won:
            return FinalScore("won", WIN_REWARD, 1.0, feedback, extra)
        return FinalScore("lost", LOSS_REWARD, -1.0, feedback, extra)


# -- opponents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """What one seat knows when it acts: its die, the last bid, the legal bids."""

    die: int
    last: int | None
    legal_bids: tuple[int, ...]


def view_of(state: pyspiel.State, player: int) -> View:
    moves = bids(state)
    legal = tuple(a for a in state.legal_actions(player) if a != LIAR)
    return View(die_of(state, player), moves[-1] if moves else None, legal)


def chance_true(action: int, die: int) -> float:
    """Probability that a bid holds, seen from a player who holds ``die``."""
    quantity, face = bid_of(action)
    need = quantity - counts(face, (die,))
    if need <= 0:
        return 1.0
    if need >= 2:
        return 0.0
    # The other die counts if it shows the face, or a wild six for a face below six.
    return (2 if face != WILD else 1) / SIDES


def _truthful(v: View) -> int:
    # Bids the lowest bid its own die guarantees; calls LIAR when none is left.
    for action in v.legal_bids:
        if chance_true(action, v.die) == 1.0:
            return action
    return LIAR


def _bluffer(v: View) -> int:
    # Claims two of its own face while it can, else the next bid up; never calls LIAR
    # unless no bid is left.
    two = bid_action(2, v.die)
    if two in v.legal_bids:
        return two
    return v.legal_bids[0] if v.legal_bids else LIAR


def _caller(v: View) -> int:
    # Opens with one of its own face, then calls LIAR on any bid.
    if v.last is None:
        return bid_action(1, v.die)
    return LIAR


def _statistician(v: View) -> int:
    # Calls LIAR when that wins more often than the likeliest raise holds.
    if not v.legal_bids:
        return LIAR
    best = max(v.legal_bids, key=lambda a: (chance_true(a, v.die), -a))
    if v.last is not None and 1 - chance_true(v.last, v.die) > chance_true(best, v.die):
        return LIAR
    return best


ARCHETYPES: dict[str, Callable[[View], int]] = {
    "truthful": _truthful,
    "bluffer": _bluffer,
    "caller": _caller,
    "statistician": _statistician,
}


class LiarsDiceRuleOpponent(Opponent):
    """A deterministic Liar's Dice strategy, a function of the seat's :class:`View`."""

    def __init__(self, name: str) -> None:
        if name not in ARCHETYPES:
            raise ValueError(f"unknown Liar's Dice archetype {name!r}; valid: {sorted(ARCHETYPES)}")
        self.name = name
        self._decide = ARCHETYPES[name]

    def act(self, state: pyspiel.State, player: int) -> int:
        return self._decide(view_of(state, player))


def _rule_factory(name: str) -> Callable[[Sequence[str]], Opponent]:
    def factory(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"liars_dice:{name} takes no arguments, got {list(args)}")
        return LiarsDiceRuleOpponent(name)

    return factory


def _random_factory(args: Sequence[str]) -> Opponent:
    if args:
        raise ValueError(f"liars_dice:random takes no arguments, got {list(args)}")
    return UniformRandomOpponent()


def register_opponents() -> None:
    """Register the Liar's Dice opponents and presets; called by :mod:`mage_rl.envs.builtins`."""
    game = "liars_dice"
    for name in ARCHETYPES:
        register_opponent_factory(game, name, _rule_factory(name), f"{game}:{name}")
    register_opponent_factory(game, "random", _random_factory, f"{game}:random")
    register_population(
        "liars_dice_train",
        lambda: Population(
            ((f"{game}:truthful", 0.3), (f"{game}:bluffer", 0.3), (f"{game}:caller", 0.4))
        ),
    )
    register_population("liars_dice_unseen", lambda: Population(((f"{game}:statistician", 1.0),)))
