"""Kuhn Poker: rendering, parsing, scoring and the opponents of SPEC §7.

OpenSpiel's ``kuhn_poker``: cards 0, 1, 2 are J, Q, K; action 0 is PASS (check or fold)
and 1 is BET (bet or call); each player antes 1 chip. The episode pays ``5 x chips`` and
a positive payoff is a win (SPEC §3). A showdown reveals both cards; a fold reveals none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyspiel

from mage_rl.cache import cache_root
from mage_rl.envs.base import Outcome
from mage_rl.envs.openspiel_env import FinalScore, GameRules, decision_states
from mage_rl.envs.opponents import Opponent, register_opponent_factory
from mage_rl.fileio import atomic_write_json

CARDS = ("J", "Q", "K")
PASS, BET = 0, 1
ACTION_NAMES = ("PASS", "BET")
# Poker words a model may use; each maps onto Kuhn's two actions.
_SYNONYMS = {"PASS": PASS, "CHECK": PASS, "FOLD": PASS, "BET": BET, "CALL": BET}
CHIP_REWARD_SCALE = 5.0


def card_of(state: pyspiel.State, player: int) -> int:
    """The card (0=J, 1=Q, 2=K) dealt to ``player``."""
    return int(state.history()[player])


def betting(state: pyspiel.State) -> list[int]:
    """The betting actions so far (the history after the two deals)."""
    return [int(a) for a in state.history()[2:]]


def facing_bet(state: pyspiel.State) -> bool:
    """Whether the player to act faces an outstanding bet."""
    return BET in betting(state)


class KuhnRules(GameRules):
    """Kuhn Poker as text."""

    game_name = "kuhn_poker"
    payoff_unit = "chips per hand"
    invalid_penalty = 2.0
    length_penalty = 2.0
    # A hand has at most two agent decisions; the rest is room for invalid answers.
    default_max_turns = 4

    def task_description(self, seat: int) -> str:
        you = "Player 1 (you act first)" if seat == 0 else "Player 2 (you act second)"
        return (
            "You are playing Kuhn Poker against a fixed opponent.\n"
            "Rules: the deck has three cards, J < Q < K. Each player antes 1 chip and "
            "gets one card. Player 1 acts first: PASS (check) or BET (1 chip). "
            "If Player 1 passes, Player 2 may PASS (showdown for the 2-chip pot) or BET; "
            "after that bet Player 1 must BET (call) or PASS (fold). If Player 1 bets, "
            "Player 2 must BET (call) or PASS (fold). At a showdown the higher card wins "
            "the pot. Whoever folds loses what they put in.\n"
            f"You are {you}.\n"
            "Answer with exactly one action inside tags, for example <action>BET</action> "
            "or <action>PASS</action>."
        )

    def brief_description(self, seat: int) -> str:
        return f"Kuhn poker as P{seat + 1}"

    def _brief_bets(self, state: pyspiel.State, seat: int) -> str:
        moves = betting(state)
        if not moves:
            return "none"
        who = ("you" if i % 2 == seat else "opp" for i in range(len(moves)))
        return ", ".join(f"{w} {ACTION_NAMES[a]}" for w, a in zip(who, moves, strict=True))

    def brief_render(self, state: pyspiel.State, seat: int) -> str:
        return f"card {CARDS[card_of(state, seat)]}, bets: {self._brief_bets(state, seat)}"

    def brief_summary(self, state: pyspiel.State, seat: int) -> str:
        line = f"card {CARDS[card_of(state, seat)]}, {self._brief_bets(state, seat)}"
        if betting(state)[-2:] != [BET, PASS]:  # a showdown reveals the opponent's card
            line += f", opp {CARDS[card_of(state, 1 - seat)]}"
        return line + f", {float(state.returns()[seat]):+g}"

    def render(self, state: pyspiel.State, seat: int) -> str:
        lines = [f"Your card: {CARDS[card_of(state, seat)]}."]
        moves = betting(state)
        if moves:
            described = []
            for i, action in enumerate(moves):
                who = "you" if i % 2 == seat else "opponent"
                described.append(f"{who} {ACTION_NAMES[action]}")
            lines.append("Betting so far: " + ", ".join(described) + ".")
        else:
            lines.append("Betting so far: none.")
        if not state.is_terminal():
            lines.append("You face a bet." if facing_bet(state) else "No bet to face.")
            lines.append("Legal actions: PASS, BET.")
        return "\n".join(lines)

    def action_text(self, state: pyspiel.State, player: int, action: int) -> str:
        return ACTION_NAMES[action]

    def parse(self, text: str, state: pyspiel.State, seat: int) -> int | str:
        # ASCII case-insensitive only: str.upper() folds Unicode too ("paſſ" -> "PASS").
        word = text.strip(" \t\r\n").strip(".!")
        if word.isascii() and word.upper() in _SYNONYMS:
            return _SYNONYMS[word.upper()]
        return f"{text.strip()[:40]!r} is not an action; write PASS or BET"

    def describe_move(self, state: pyspiel.State, player: int, action: int, seat: int) -> str:
        who = "You" if player == seat else "Opponent"
        return f"{who}: {ACTION_NAMES[action]}"

    def score(self, state: pyspiel.State, seat: int) -> FinalScore:
        payoff = float(state.returns()[seat])
        outcome: Outcome = "won" if payoff > 0 else "lost" if payoff < 0 else "draw"
        moves = betting(state)
        # A hand ends in a fold exactly when its last action is a PASS answering a BET.
        folded = len(moves) >= 2 and moves[-1] == PASS and moves[-2] == BET
        mine = CARDS[card_of(state, seat)]
        extra: dict[str, Any] = {"agent_card": mine, "showdown": not folded}
        chips = f"{abs(payoff):g} chip{'s' if abs(payoff) != 1 else ''}"
        result = f"You {'won' if payoff > 0 else 'lost'} {chips}."
        if folded:
            folder_is_agent = (len(moves) - 1) % 2 == seat
            who = "You folded" if folder_is_agent else "The opponent folded"
            feedback = f"{who}; no cards are shown. {result}"
        else:
            theirs = CARDS[card_of(state, 1 - seat)]
            extra["opponent_card"] = theirs
            feedback = f"Showdown: your {mine} against the opponent's {theirs}. {result}"
        return FinalScore(outcome, CHIP_REWARD_SCALE * payoff, payoff, feedback, extra)


# -- opponents (SPEC §7) ---------------------------------------------------------------


class RuleOpponent(Opponent):
    """A deterministic Kuhn strategy given as ``decide(card, facing_bet) -> action``."""

    def __init__(self, name: str) -> None:
        if name not in _ARCHETYPES:
            raise ValueError(f"unknown Kuhn archetype {name!r}; valid: {sorted(_ARCHETYPES)}")
        self.name = name
        self._decide = _ARCHETYPES[name]

    def act(self, state: pyspiel.State, player: int) -> int:
        return self._decide(card_of(state, player), facing_bet(state))


def _conservative(card: int, facing: bool) -> int:
    return BET if card == 2 else PASS


def _aggressive(card: int, facing: bool) -> int:
    if facing:
        return PASS if card == 0 else BET
    return BET


def _intermediate(card: int, facing: bool) -> int:
    if card == 2:
        return BET
    if card == 0:
        return PASS
    return PASS if facing else BET


_ARCHETYPES = {
    "conservative": _conservative,
    "aggressive": _aggressive,
    "intermediate": _intermediate,
}

CFR_ITERATIONS = 1000


def cache_dir() -> Path:
    """Where solved policies and converted models are cached (``$MAGE_RL_CACHE``)."""
    return cache_root()


def solve_cfr_policy(iterations: int = CFR_ITERATIONS) -> dict[str, int]:
    """Argmax of OpenSpiel CFR's average policy, by information state string.

    The solved table is cached on disk, so each process does not solve it again.
    """
    path = cache_dir() / f"kuhn_cfr_{iterations}.json"
    if path.exists():
        try:
            return {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except (ValueError, OSError):
            pass  # a damaged cache file is solved again and overwritten
    game = pyspiel.load_game("kuhn_poker")
    solver = pyspiel.CFRSolver(game)
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    average = solver.average_policy()
    table: dict[str, int] = {}
    for state in decision_states(game):
        info_state = state.information_state_string(state.current_player())
        probs = dict(average.get_state_policy(info_state))
        table[info_state] = max(sorted(probs), key=lambda a: probs[a])
    atomic_write_json(path, table, indent=1, sort_keys=True)
    return table


class CFROpponent(Opponent):
    """The out-of-distribution opponent: argmax of the CFR average policy."""

    def __init__(self, iterations: int = CFR_ITERATIONS) -> None:
        self.table = solve_cfr_policy(iterations)

    def act(self, state: pyspiel.State, player: int) -> int:
        return self.table[state.information_state_string(player)]


def _rule_factory(name: str):
    def factory(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"kuhn:{name} takes no arguments, got {list(args)}")
        return RuleOpponent(name)

    return factory


def _cfr_factory(args: Sequence[str]) -> Opponent:
    if len(args) > 1:
        raise ValueError(f"kuhn:cfr takes at most one argument (iterations), got {list(args)}")
    return CFROpponent(int(args[0]) if args else CFR_ITERATIONS)


def register_opponents() -> None:
    """Register the Kuhn Poker opponents (SPEC §7); called by :mod:`mage_rl.envs.builtins`."""
    for name in _ARCHETYPES:
        register_opponent_factory("kuhn_poker", name, _rule_factory(name), f"kuhn_poker:{name}")
    register_opponent_factory("kuhn_poker", "cfr", _cfr_factory, "kuhn_poker:cfr[:ITERATIONS]")
