"""A new environment as a plugin: matching pennies against opponents with habits.

OpenSpiel's ``matrix_mp`` is a simultaneous-move game; its turn-based wrapper lets the
shared adapter play it (the agent never sees the opponent's hidden choice). Both players
choose HEADS or TAILS; the first player (seat 0) wins when the choices match, the second
(seat 1) when they differ. One round is one episode, so a meta-episode of K rounds asks:
can the agent read the habit of an opponent it meets K times?

    mage --plugin examples/extending/pennies.py opponents pennies
    mage train examples/extending/pennies_tiny.yaml        # plugins: [pennies.py]
"""

from __future__ import annotations

from mage_rl.envs import (
    GameRules,
    Opponent,
    register_env,
    register_opponent,
    register_opponent_factory,
    register_population,
)
from mage_rl.envs.openspiel_env import FinalScore

CHOICES = ("HEADS", "TAILS")  # matrix_mp action ids 0, 1
HEADS, TAILS = 0, 1


class MatchingPenniesRules(GameRules):
    game_name = "turn_based_simultaneous_game(game=matrix_mp())"
    invalid_penalty = 0.5
    default_max_turns = 2

    def task_description(self, seat: int) -> str:
        if seat == 0:
            role = "You are the matcher: you win if both choices are the same, and the "
            role += "opponent wins if they differ."
        else:
            role = "You are the mismatcher: you win if the two choices differ, and the "
            role += "opponent wins if they are the same."
        return (
            "You play matching pennies. You and the opponent each choose HEADS or TAILS "
            f"at the same time, without seeing the other's choice. {role} Answer with "
            "exactly one choice inside the tags, for example <action>HEADS</action>."
        )

    def render(self, state, seat: int) -> str:
        return "Choose HEADS or TAILS."

    def action_text(self, state, player: int, action: int) -> str:
        return CHOICES[action]

    def parse(self, text: str, state, seat: int) -> int | str:
        word = text.strip().upper()
        if word not in CHOICES:
            return f"{text.strip()!r} is not a choice; write HEADS or TAILS"
        return CHOICES.index(word)

    def describe_move(self, state, player: int, action: int, seat: int) -> str:
        return f"You chose {CHOICES[action]}" if player == seat else "The opponent chose."

    def score(self, state, seat: int) -> FinalScore:
        final = super().score(state, seat)
        history = state.history()  # the two players' choices, in seat order
        mine, theirs = CHOICES[history[seat]], CHOICES[history[1 - seat]]
        same = "the choices match" if mine == theirs else "the choices differ"
        final.feedback = f"You chose {mine}, the opponent chose {theirs}: {same}."
        return final


class Alternate(Opponent):
    """Plays HEADS, then TAILS, then HEADS, ... across the rounds of a meta-episode.

    Every meta-episode builds its own environment and opponent, so the count starts
    afresh each time; ``reset`` runs before every round (episode).
    """

    def __init__(self) -> None:
        self.rounds = 0

    def reset(self, seed: int) -> None:
        self.rounds += 1

    def act(self, state, player: int) -> int:
        return HEADS if self.rounds % 2 == 1 else TAILS


register_env("pennies", rules=MatchingPenniesRules())
register_opponent("pennies", "always_heads", lambda state, player: HEADS)
register_opponent("pennies", "always_tails", lambda state, player: TAILS)
register_opponent_factory("pennies", "alternate", lambda args: Alternate(), "pennies:alternate")
register_population("pennies_train", "pennies:always_heads=1,pennies:always_tails=1")
register_population("pennies_unseen", "pennies:alternate=1")
