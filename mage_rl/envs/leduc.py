"""Leduc Hold'em: rendering, parsing, scoring and opponent archetypes.

OpenSpiel's ``leduc_poker`` with its default parameters (two players): six cards, two
each of J, Q, K (card ids 0-5, rank ``id // 2``); ante 1 chip each; two betting rounds
with a raise of 2 chips in the first and 4 in the second, at most two raises a round;
one public card is dealt between the rounds; player 0 acts first in both. Actions are
0 FOLD, 1 CALL (a check when nothing is owed) and 2 RAISE. At the showdown a card that
pairs the public card wins, else the higher card; equal ranks split the pot.

The episode pays ``10/13`` per chip: the largest pot Leduc can pay (13 chips) maps to the
SPEC §3 win reward of 10, as Kuhn's 2 chips map to 10 with its ``5 x chips``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyspiel

from mage_rl.envs.base import Outcome
from mage_rl.envs.openspiel_env import FinalScore, GameRules
from mage_rl.envs.opponents import (
    Opponent,
    Population,
    register_opponent_factory,
    register_population,
)
from mage_rl.envs.policy_opponents import SolvedPolicyOpponent, UniformRandomOpponent

RANKS = ("J", "Q", "K")
FOLD, CALL, RAISE = 0, 1, 2
RAISE_SIZE = (2, 4)  # chips per raise in rounds 1 and 2
MAX_PAYOFF = 13.0
REWARD_PER_CHIP = 10.0 / MAX_PAYOFF


@dataclass(frozen=True)
class Timeline:
    """What happened in a Leduc hand so far, split by round.

    Attributes:
        cards: The private card id of each player.
        public: The public card id, ``None`` before it is dealt.
        rounds: ``(player, action)`` pairs of round 1 and of round 2.
    """

    cards: tuple[int, int]
    public: int | None
    rounds: tuple[list[tuple[int, int]], list[tuple[int, int]]]


def timeline(state: pyspiel.State) -> Timeline:
    """Replay the history to split it into deals, rounds and the public card."""
    replay = state.get_game().new_initial_state()
    deals: list[int] = []
    rounds: tuple[list[tuple[int, int]], list[tuple[int, int]]] = ([], [])
    for action in state.history():
        if replay.is_chance_node():
            deals.append(int(action))
        else:
            rounds[0 if len(deals) < 3 else 1].append((replay.current_player(), int(action)))
        replay.apply_action(action)
    public = deals[2] if len(deals) > 2 else None
    return Timeline((deals[0], deals[1]), public, rounds)


def contributions(state: pyspiel.State) -> tuple[int, int]:
    """Chips each player has put in the pot (ante included), replayed from the betting.

    OpenSpiel's own money counters already hold the payout once a hand is over, so the
    stakes are recomputed: a call matches the other stake, a raise matches it and adds
    the round's raise size.
    """
    put = [1, 1]
    for number, moves in enumerate(timeline(state).rounds):
        for player, action in moves:
            if action == FOLD:
                continue
            put[player] = put[1 - player] + (RAISE_SIZE[number] if action == RAISE else 0)
    return put[0], put[1]


def to_call(state: pyspiel.State, player: int) -> int:
    """Chips ``player`` must add to match the other player's stake."""
    put = contributions(state)
    return max(0, put[1 - player] - put[player])


def card_name(card: int | None) -> str:
    return "-" if card is None else RANKS[card // 2]


def _call_word(state: pyspiel.State, player: int) -> str:
    return "CALL" if to_call(state, player) > 0 else "CHECK"


class LeducRules(GameRules):
    """Leduc Hold'em as text."""

    game_name = "leduc_poker"
    payoff_unit = "chips per hand"
    invalid_penalty = 0.5
    length_penalty = 2.0
    # At most four agent decisions (two a round); the rest is room for invalid answers.
    default_max_turns = 8

    def task_description(self, seat: int) -> str:
        order = "first" if seat == 0 else "second"
        you = f"Player {seat + 1} (you act {order} in each round)"
        return (
            "You are playing Leduc Hold'em poker against a fixed opponent.\n"
            "Rules: the deck has six cards, two each of J < Q < K. Each player antes 1 "
            "chip and gets one private card. There are two betting rounds; after the "
            "first, one public card is dealt face up. Player 1 acts first in each round. "
            "With nothing to call you may CHECK or RAISE; facing a raise you may FOLD, "
            "CALL or RAISE. A raise is 2 chips in round 1 and 4 chips in round 2, at "
            "most two raises a round. A round ends when a raise is called or both "
            "players check. Folding loses what you put in. At the showdown a private "
            "card that pairs the public card wins; otherwise the higher card wins; equal "
            "cards split the pot.\n"
            f"You are {you}.\n"
            "Answer with exactly one action inside tags: FOLD, CHECK, CALL or RAISE, for "
            "example <action>RAISE</action>."
        )

    def brief_description(self, seat: int) -> str:
        return f"Leduc poker as P{seat + 1}"

    def _moves(self, state: pyspiel.State, seat: int, brief: bool) -> list[str]:
        """Each round's betting as text (a replayed state gives CHECK or CALL right)."""
        line = timeline(state)
        replay = state.get_game().new_initial_state()
        replay.apply_action(line.cards[0])
        replay.apply_action(line.cards[1])
        texts = []
        for number, moves in enumerate(line.rounds, start=1):
            if number == 2 and line.public is not None:
                replay.apply_action(line.public)
            words = []
            for player, action in moves:
                who = "you" if player == seat else "opp" if brief else "opponent"
                words.append(f"{who} {self.action_text(replay, player, action)}")
                replay.apply_action(action)
            if words or number == 1:
                texts.append(", ".join(words) or "none")
        return texts

    def brief_render(self, state: pyspiel.State, seat: int) -> str:
        line = timeline(state)
        rounds = "; ".join(
            f"r{i} {m}" for i, m in enumerate(self._moves(state, seat, brief=True), start=1)
        )
        return (
            f"card {card_name(line.cards[seat])}, board {card_name(line.public)}, "
            f"pot {sum(contributions(state))}, {rounds}"
        )

    def brief_summary(self, state: pyspiel.State, seat: int) -> str:
        line = timeline(state)
        text = self.brief_render(state, seat)
        if not _folded(line):
            text += f", opp {card_name(line.cards[1 - seat])}"
        return text + f", {float(state.returns()[seat]):+g}"

    def render(self, state: pyspiel.State, seat: int) -> str:
        line = timeline(state)
        mine, theirs = contributions(state)[seat], contributions(state)[1 - seat]
        lines = [f"Your card: {card_name(line.cards[seat])}."]
        if line.public is None:
            lines.append("Public card: not dealt yet (it comes after round 1).")
        else:
            lines.append(f"Public card: {card_name(line.public)}.")
        for number, text in enumerate(self._moves(state, seat, brief=False), start=1):
            lines.append(f"Round {number} betting: {text}.")
        lines.append(f"Pot: {mine + theirs} chips (you put in {mine}, the opponent {theirs}).")
        if not state.is_terminal():
            owed = to_call(state, seat)
            lines.append(
                f"You must put in {owed} more chip{'s' if owed != 1 else ''} to call."
                if owed
                else "Nothing to call."
            )
            legal = ", ".join(self.action_text(state, seat, a) for a in state.legal_actions())
            lines.append(f"Legal actions: {legal}.")
        return "\n".join(lines)

    def action_text(self, state: pyspiel.State, player: int, action: int) -> str:
        if action == CALL:
            return _call_word(state, player)
        return "FOLD" if action == FOLD else "RAISE"

    def parse(self, text: str, state: pyspiel.State, seat: int) -> int | str:
        word = text.strip().rstrip(".!").upper()
        legal = state.legal_actions()
        owed = to_call(state, seat)
        options = ", ".join(self.action_text(state, seat, a) for a in legal)
        if word not in ("FOLD", "CHECK", "CALL", "RAISE"):
            return f"{text.strip()[:40]!r} is not an action; write one of {options}"
        if word == "CHECK" and owed:
            return f"you cannot CHECK: the opponent raised, so write one of {options}"
        if word == "FOLD" and not owed:
            return f"nothing to call, so there is no reason to FOLD; write one of {options}"
        if word == "RAISE" and RAISE not in legal:
            return f"this round already had two raises; write one of {options}"
        # CALL with nothing owed is a check, as in OpenSpiel.
        return {"FOLD": FOLD, "CHECK": CALL, "CALL": CALL, "RAISE": RAISE}[word]

    def describe_move(self, state: pyspiel.State, player: int, action: int, seat: int) -> str:
        who = "You" if player == seat else "Opponent"
        return f"{who}: {self.action_text(state, player, action)}"

    def score(self, state: pyspiel.State, seat: int) -> FinalScore:
        payoff = float(state.returns()[seat])
        outcome: Outcome = "won" if payoff > 0 else "lost" if payoff < 0 else "draw"
        line = timeline(state)
        mine = card_name(line.cards[seat])
        extra: dict[str, Any] = {
            "agent_card": mine,
            "public_card": card_name(line.public) if line.public is not None else None,
            "showdown": not _folded(line),
        }
        chips = f"{abs(payoff):g} chip{'s' if abs(payoff) != 1 else ''}"
        result = (
            "The pot was split."
            if payoff == 0
            else (f"You {'won' if payoff > 0 else 'lost'} {chips}.")
        )
        if _folded(line):
            folder = line.rounds[1][-1][0] if line.rounds[1] else line.rounds[0][-1][0]
            who = "You folded" if folder == seat else "The opponent folded"
            feedback = f"{who}; no cards are shown. {result}"
        else:
            theirs = card_name(line.cards[1 - seat])
            extra["opponent_card"] = theirs
            feedback = (
                f"Showdown: your {mine} against the opponent's {theirs}, public card "
                f"{card_name(line.public)}. {result}"
            )
        return FinalScore(outcome, REWARD_PER_CHIP * payoff, payoff, feedback, extra)


def _folded(line: Timeline) -> bool:
    last = line.rounds[1] or line.rounds[0]
    return bool(last) and last[-1][1] == FOLD


# -- opponents ---------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """What one seat knows when it acts: the ranks and the betting situation."""

    rank: int
    public_rank: int | None
    facing: bool
    can_raise: bool

    @property
    def pair(self) -> bool:
        return self.public_rank == self.rank


def view_of(state: pyspiel.State, player: int) -> View:
    line = timeline(state)
    public = None if line.public is None else line.public // 2
    return View(
        rank=line.cards[player] // 2,
        public_rank=public,
        facing=to_call(state, player) > 0,
        can_raise=RAISE in state.legal_actions(player),
    )


def _tight_passive(v: View) -> int:
    # Never raises; stays in against a raise only with a K, or a pair on the board.
    if not v.facing:
        return CALL
    return CALL if v.rank == 2 or v.pair else FOLD


def _loose_aggressive(v: View) -> int:
    # Raises whenever a raise is left, never folds.
    return RAISE if v.can_raise else CALL


def _rock(v: View) -> int:
    # Raises only with a pair; checks otherwise, calls a raise with Q or K before the
    # public card and only with a K after it.
    if v.pair:
        return RAISE if v.can_raise else CALL
    if not v.facing:
        return CALL
    keep = v.rank >= 1 if v.public_rank is None else v.rank == 2
    return CALL if keep else FOLD


def _calling_station(v: View) -> int:
    # Checks and calls everything: never folds, never raises.
    return CALL


ARCHETYPES: dict[str, Callable[[View], int]] = {
    "tight_passive": _tight_passive,
    "calling_station": _calling_station,
    "loose_aggressive": _loose_aggressive,
    "rock": _rock,
}


class LeducRuleOpponent(Opponent):
    """A deterministic Leduc strategy, a function of the seat's :class:`View`."""

    def __init__(self, name: str) -> None:
        if name not in ARCHETYPES:
            raise ValueError(f"unknown Leduc archetype {name!r}; valid: {sorted(ARCHETYPES)}")
        self.name = name
        self._decide = ARCHETYPES[name]

    def act(self, state: pyspiel.State, player: int) -> int:
        return self._decide(view_of(state, player))


CFR_ITERATIONS = 500


def _rule_factory(name: str) -> Callable[[Sequence[str]], Opponent]:
    def factory(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"leduc_poker:{name} takes no arguments, got {list(args)}")
        return LeducRuleOpponent(name)

    return factory


def _random_factory(args: Sequence[str]) -> Opponent:
    if args:
        raise ValueError(f"leduc_poker:random takes no arguments, got {list(args)}")
    return UniformRandomOpponent()


def _cfr_factory(args: Sequence[str]) -> Opponent:
    if len(args) > 1 or (args and not args[0].isdigit()):
        raise ValueError(
            f"write leduc_poker:cfr[:ITERATIONS] with a whole number, got {list(args)}"
        )
    return SolvedPolicyOpponent("leduc_poker", int(args[0]) if args else CFR_ITERATIONS)


def register_opponents() -> None:
    """Register the Leduc opponents and presets; called by :mod:`mage_rl.envs.builtins`."""
    game = "leduc_poker"
    for name in ARCHETYPES:
        register_opponent_factory(game, name, _rule_factory(name), f"{game}:{name}")
    register_opponent_factory(game, "random", _random_factory, f"{game}:random")
    register_opponent_factory(game, "cfr", _cfr_factory, f"{game}:cfr[:ITERATIONS]")
    register_population(
        "leduc_train",
        lambda: Population(
            (
                (f"{game}:tight_passive", 0.3),
                (f"{game}:loose_aggressive", 0.3),
                (f"{game}:rock", 0.2),
                (f"{game}:calling_station", 0.2),
            )
        ),
    )
    register_population("leduc_unseen", lambda: Population(((f"{game}:cfr", 1.0),)))
