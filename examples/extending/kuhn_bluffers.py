"""Opponents as a plugin: two Kuhn Poker strategies and a population of them.

An opponent is a function of the OpenSpiel state and its seat that returns a legal
action id (Kuhn Poker: 0 = PASS, 1 = BET). Registered under ``kuhn``, they are
``kuhn_poker:always_bet`` and ``kuhn_poker:never_call`` in every command:

    mage --plugin examples/extending/kuhn_bluffers.py oracle kuhn --population always_bet=1
    mage --plugin examples/extending/kuhn_bluffers.py eval --agent reflexion=tiny \\
        --opponents bluffers --n 8 --out runs/eval_bluffers
"""

from __future__ import annotations

from mage_rl.envs import register_opponent, register_population

PASS, BET = 0, 1


def always_bet(state, player: int) -> int:
    """Bets, and calls every bet, whatever the card."""
    return BET


def never_call(state, player: int) -> int:
    """Bets the king, checks otherwise, and folds to every bet."""
    card = state.history()[player]  # the two deal actions come first: cards of seats 0, 1
    facing_bet = state.history()[2:].count(BET) > 0
    if facing_bet:
        return PASS
    return BET if card == 2 else PASS


register_opponent("kuhn", "always_bet", always_bet)
register_opponent("kuhn", "never_call", never_call)
register_population("bluffers", "kuhn:always_bet=0.5,kuhn:never_call=0.5")
