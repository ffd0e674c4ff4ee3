"""A new environment as a plugin: rock-paper-scissors against opponents with habits.

OpenSpiel's ``matrix_rps`` is a simultaneous-move game; its turn-based wrapper lets the
shared adapter play it (the agent never sees the opponent's hidden choice). One round is
one episode, so a meta-episode of K rounds asks: can the agent read the habit of an
opponent it meets K times?

    mage --plugin examples/extending/rps.py opponents rps
    mage train examples/extending/rps_tiny.yaml            # plugins: [rps.py]
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

MOVES = ("ROCK", "PAPER", "SCISSORS")  # matrix_rps action ids 0, 1, 2


class RockPaperScissorsRules(GameRules):
    game_name = "turn_based_simultaneous_game(game=matrix_rps())"
    invalid_penalty = 0.5
    default_max_turns = 2

    def task_description(self, seat: int) -> str:
        return (
            "You play rock-paper-scissors. ROCK beats SCISSORS, SCISSORS beats PAPER, "
            "PAPER beats ROCK. Answer with exactly one move inside the tags, for example "
            "<action>PAPER</action>."
        )

    def render(self, state, seat: int) -> str:
        return "Choose your move: ROCK, PAPER or SCISSORS."

    def action_text(self, state, player: int, action: int) -> str:
        return MOVES[action]

    def parse(self, text: str, state, seat: int) -> int | str:
        word = text.strip().upper()
        if word not in MOVES:
            return f"{text.strip()!r} is not a move; write ROCK, PAPER or SCISSORS"
        return MOVES.index(word)

    def describe_move(self, state, player: int, action: int, seat: int) -> str:
        return f"You played {MOVES[action]}" if player == seat else "The opponent chose."

    def score(self, state, seat: int) -> FinalScore:
        final = super().score(state, seat)
        history = state.history()  # the two players' choices, in seat order
        mine, theirs = MOVES[history[seat]], MOVES[history[1 - seat]]
        final.feedback = f"You played {mine}, the opponent played {theirs}."
        return final


class Cycle(Opponent):
    """Plays ROCK, then PAPER, then SCISSORS, ... across the rounds of a meta-episode.

    Every meta-episode builds its own environment and opponent, so the count starts
    afresh each time; ``reset`` runs before every round (episode).
    """

    def __init__(self) -> None:
        self.rounds = 0

    def reset(self, seed: int) -> None:
        self.rounds += 1

    def act(self, state, player: int) -> int:
        return (self.rounds - 1) % 3


register_env("rps", rules=RockPaperScissorsRules(), aliases=("roshambo",))
for index, move in enumerate(MOVES):
    register_opponent("rps", f"always_{move.lower()}", lambda state, player, a=index: a)
register_opponent_factory("rps", "cycle", lambda args: Cycle(), "rps:cycle")
register_population("rps_train", "rps:always_rock=1,rps:always_paper=1,rps:always_scissors=1")
register_population("rps_unseen", "rps:cycle=1")
