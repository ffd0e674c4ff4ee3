"""Rock-paper-scissors opponents of your own, as a plugin: one that reacts to your moves.

A rock-paper-scissors opponent is a model: given the earlier rounds of the meta-episode,
(your move, its move) pairs, the probabilities of its next move (ROCK, PAPER, SCISSORS).
Registered with ``register_rps_opponent``, it plays in every command, and its exact values
(best constant move, Bayes value of each round, ceiling) come from ``mage oracle rps``:

    mage --plugin examples/extending/rps_reactive.py oracle rps --population rps_echoes
    mage --plugin examples/extending/rps_reactive.py eval --agent mage=runs/rps_smollm2 \\
        --opponents rps_echoes --n 96 --out runs/eval_echoes
"""

from __future__ import annotations

from mage_rl.envs import register_population
from mage_rl.envs.rps import register_rps_opponent

ROCK, PAPER, SCISSORS = 0, 1, 2
UNIFORM = (1 / 3, 1 / 3, 1 / 3)


def echo_two_back(history):
    """Plays what you played two rounds ago; a random move before that."""
    if len(history) < 2 or history[-2][0] is None:
        return UNIFORM
    probs = [0.0, 0.0, 0.0]
    probs[history[-2][0]] = 1.0
    return tuple(probs)


def sore_loser(history):
    """Plays ROCK until it loses a round, then the move that beats your last one."""
    lost = [(you, it) for you, it in history if you is not None and (you - it) % 3 == 1]
    if not lost:
        return (1.0, 0.0, 0.0)
    probs = [0.0, 0.0, 0.0]
    probs[(history[-1][0] + 1) % 3 if history[-1][0] is not None else ROCK] = 1.0
    return tuple(probs)


register_rps_opponent("echo_two_back", echo_two_back)
register_rps_opponent("sore_loser", sore_loser)
register_population("rps_echoes", "rps:echo_two_back=1,rps:sore_loser=1")
