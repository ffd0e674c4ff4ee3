"""Scripted strategies played through the text environment, against exact values.

A quick end-to-end check of the environment stack that needs no model: each scripted
Kuhn strategy answers the environment in text (``<action>BET</action>``), plays many
fresh deals against each opponent, and its measured chips per hand are set beside the
exact expected value that OpenSpiel computes for the same pair of policies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from open_spiel.python.algorithms import expected_game_score

from mage_rl.envs import derive_seed, make_env, make_opponent
from mage_rl.eval.oracles import kuhn_game, opponent_policy


@dataclass
class MatchupResult:
    """Measured and exact chips per hand of one (strategy, opponent, seat)."""

    strategy: str
    opponent: str
    seat: str
    hands: int
    mean_payoff: float
    stderr: float
    exact: float
    invalid_actions: int


def play_matchup(
    strategy: str,
    opponent: str,
    seat: int,
    hands: int,
    seed: int = 0,
    progress: Callable[[], None] | None = None,
) -> MatchupResult:
    """Play ``hands`` fresh Kuhn hands of a scripted strategy against an opponent.

    Args:
        strategy: Spec of the scripted strategy in the agent seat (any Kuhn opponent).
        opponent: Spec of the opponent.
        seat: Agent seat.
        hands: Number of hands (each with its own deal).
        seed: Base seed; hand i uses a seed derived from it.
        progress: Called once per hand (for a progress bar).
    """
    env = make_env("kuhn_poker", opponent, seat=seat)
    agent = make_opponent(strategy)
    payoffs: list[float] = []
    invalid = 0
    for i in range(hands):
        env.reset(derive_seed("matchup", seed, i))
        agent.reset(i)
        while True:
            assert env.state is not None
            action = agent.act(env.state, seat)
            result = env.step(f"<action>{env.rules.action_text(env.state, seat, action)}</action>")
            invalid += result.info.invalid
            if result.done:
                payoffs.append(float(result.info.payoff or 0.0))
                break
        if progress:
            progress()
    mean = sum(payoffs) / len(payoffs)
    var = sum((p - mean) ** 2 for p in payoffs) / max(1, len(payoffs) - 1)
    players = [opponent_policy(strategy, seat), opponent_policy(opponent, 1 - seat)]
    if seat == 1:
        players.reverse()
    exact = expected_game_score.policy_value(kuhn_game().new_initial_state(), players)[seat]
    return MatchupResult(
        strategy=strategy,
        opponent=opponent,
        seat="first" if seat == 0 else "second",
        hands=hands,
        mean_payoff=mean,
        stderr=math.sqrt(var / len(payoffs)),
        exact=float(exact),
        invalid_actions=invalid,
    )


def kuhn_matchups(
    strategies: Iterable[str],
    opponents: Iterable[str],
    hands: int,
    seed: int = 0,
    progress: Callable[[], None] | None = None,
) -> list[MatchupResult]:
    """Every (strategy, opponent, seat) combination."""
    opponents = list(opponents)
    return [
        play_matchup(s, o, seat, hands, seed, progress)
        for s in strategies
        for o in opponents
        for seat in (0, 1)
    ]
