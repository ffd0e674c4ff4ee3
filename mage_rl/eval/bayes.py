"""Bayes values of the last hand of a Kuhn meta-episode: what identification can earn.

With fresh deals and a deterministic opponent drawn from a known population, an agent
that has watched K-1 hands holds a posterior over the opponents; the best it can do in
the last hand is to best-respond to that posterior. Two values are computed exactly, by
enumeration over the six deals of every hand:

* **fixed probing** (SPEC §9): the first K-1 hands follow one pure strategy, the same in
  every hand, chosen to maximise the last hand's value. A lower bound on the
  Bayes-optimal value.
* **adaptive probing**: the probing strategy of each hand may depend on what the earlier
  hands showed (a dynamic programme over beliefs). This is the Bayes-optimal value of
  the last hand when only the last hand counts, as in MAGE's objective; the agent may
  lose chips while probing.

What a hand shows the agent: its own card, the betting sequence, and the opponent's card
only at a showdown (a fold reveals nothing), as in the text environment.

The agent's pure strategies assign PASS or BET to each of its six information sets (three
cards times two decision points), so there are 64 per seat. The value of the last hand
against a belief ``b`` is ``max_s sum_o b(o) V(s, o)``, a best response to the mixture
in which nature draws the opponent before the deal; it is positively homogeneous in
``b``, which lets unnormalised beliefs with the same direction be merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from itertools import product

import numpy as np
import pyspiel

from mage_rl.envs.kuhn import BET, PASS, card_of
from mage_rl.envs.openspiel_env import decision_states
from mage_rl.envs.opponents import Population, make_opponent

DEALS = tuple((a, b) for a in range(3) for b in range(3) if a != b)  # (player 0, player 1)
Observation = tuple  # (own card, betting sequence, opponent card or -1)


@dataclass(frozen=True)
class HandTable:
    """Every pure agent strategy against every opponent, for one seat.

    Attributes:
        values: ``(S, O)`` expected chips of one hand for strategy s against opponent o.
        likelihoods: For each strategy, a list of ``(O,)`` arrays, the probability of
            each distinct observation under each opponent.
    """

    values: np.ndarray
    likelihoods: tuple[tuple[np.ndarray, ...], ...]


def _info_sets(seat: int) -> list[tuple[int, tuple[int, ...]]]:
    """The agent's decision points: (card, betting so far)."""
    points = [()] if seat == 0 else [(PASS,), (BET,)]
    if seat == 0:
        points.append((PASS, BET))
    return [(card, hist) for card in range(3) for hist in points]


def _play(
    deal: tuple[int, int], strategy: dict, opponent: object, seat: int
) -> tuple[float, Observation]:
    game = _game()
    state = game.new_initial_state()
    state.apply_action(deal[0])
    state.apply_action(deal[1])
    betting: list[int] = []
    while not state.is_terminal():
        player = state.current_player()
        if player == seat:
            action = strategy[(card_of(state, seat), tuple(betting))]
        else:
            action = opponent.act(state, player)  # type: ignore[attr-defined]
        betting.append(int(action))
        state.apply_action(action)
    folded = betting[-2:] == [BET, PASS]
    shown = -1 if folded else card_of(state, 1 - seat)
    return float(state.returns()[seat]), (card_of(state, seat), tuple(betting), shown)


@lru_cache(maxsize=1)
def _game() -> pyspiel.Game:
    return pyspiel.load_game("kuhn_poker")


def hand_table(opponents: Sequence[str], seat: int) -> HandTable:
    """Enumerate the 64 pure strategies of ``seat`` against each deterministic opponent."""
    points = _info_sets(seat)
    players = [make_opponent(spec) for spec in opponents]
    for p in players:
        p.reset(0)
    values = np.zeros((2 ** len(points), len(players)))
    likelihoods = []
    for s, actions in enumerate(product((PASS, BET), repeat=len(points))):
        strategy = dict(zip(points, actions, strict=True))
        obs_prob: dict[Observation, np.ndarray] = {}
        for o, opponent in enumerate(players):
            for deal in DEALS:
                payoff, obs = _play(deal, strategy, opponent, seat)
                values[s, o] += payoff / len(DEALS)
                obs_prob.setdefault(obs, np.zeros(len(players)))[o] += 1 / len(DEALS)
        likelihoods.append(tuple(obs_prob.values()))
    return HandTable(values, tuple(likelihoods))


def observation_likelihood(opponent: object, seat: int, observation: Observation) -> float:
    """Probability that a deterministic opponent produces what the agent saw of a hand.

    ``observation`` is ``(own card, betting so far, opponent card or -1)``; the betting
    may be unfinished (a hand still in play), and ``-1`` means no card was shown (a fold,
    or a hand not yet over). The probability is over the opponent's card, uniform over
    the two the agent does not hold; the agent's own moves are taken as given.
    """
    own, moves, shown = observation
    total = 0.0
    for card in range(3):
        if card == own or (shown >= 0 and card != shown):
            continue
        state = _game().new_initial_state()
        state.apply_action(own if seat == 0 else card)
        state.apply_action(card if seat == 0 else own)
        consistent = True
        for move in moves:
            player = state.current_player()
            if player != seat and int(opponent.act(state, player)) != move:  # type: ignore[attr-defined]
                consistent = False
                break
            state.apply_action(move)
        total += 0.5 if consistent else 0.0
    return total


def _direction(w: np.ndarray) -> tuple[float, ...]:
    total = float(w.sum())
    return tuple(np.round(w / total, 12)) if total > 0 else tuple(w)


def last_hand_value_fixed(table: HandTable, prior: np.ndarray, num_episodes: int) -> float:
    """Best last-hand value when the K-1 earlier hands repeat one pure strategy."""
    best = -np.inf
    for lik in table.likelihoods:
        beliefs = {_direction(prior): prior.copy()}
        for _ in range(num_episodes - 1):
            merged: dict[tuple[float, ...], np.ndarray] = {}
            for w in beliefs.values():
                for p in lik:
                    nw = w * p
                    if nw.sum() <= 0:
                        continue
                    key = _direction(nw)
                    merged[key] = merged.get(key, 0) + nw
            beliefs = merged
        value = sum(float((table.values @ w).max()) for w in beliefs.values())
        best = max(best, value)
    return best


def last_hand_value_adaptive(table: HandTable, prior: np.ndarray, num_episodes: int) -> float:
    """Bayes-optimal last-hand value: probing may change after every hand."""

    @cache
    def value(direction: tuple[float, ...], hands_left: int) -> float:
        w = np.asarray(direction)
        if hands_left == 1:
            return float((table.values @ w).max())
        best = -np.inf
        for lik in table.likelihoods:
            total = 0.0
            for p in lik:
                nw = w * p
                mass = float(nw.sum())
                if mass > 0:
                    total += mass * value(_direction(nw), hands_left - 1)
            best = max(best, total)
        return best

    return value(_direction(prior), num_episodes)


def _is_deterministic(spec: str, trials: int = 4) -> bool:
    """Whether the opponent picks the same action in every state whatever its seed."""
    choices: dict[str, set[int]] = {}
    for seed in range(trials):
        opponent = make_opponent(spec)
        opponent.reset(seed)
        for state in decision_states(_game()):
            key = state.history_str()
            choices.setdefault(key, set()).add(int(opponent.act(state, state.current_player())))
    return all(len(actions) == 1 for actions in choices.values())


def bayes_last_hand(
    population: Population, seat: int, episodes: Sequence[int] = (2, 3, 4, 5)
) -> dict[str, dict[int, float]]:
    """Fixed- and adaptive-probing last-hand values for each K, for one seat.

    Raises:
        ValueError: If the population holds an opponent that is not a deterministic
            Kuhn strategy (the enumeration needs 0/1 action probabilities).
    """
    specs = list(population.specs)
    for spec in specs:
        if not _is_deterministic(spec):
            raise ValueError(
                f"{spec} does not act deterministically; the enumeration needs opponents "
                "whose every action has probability 0 or 1"
            )
    table = hand_table(specs, seat)
    prior = np.asarray(population.weights, dtype=float)
    return {
        "fixed": {k: last_hand_value_fixed(table, prior, k) for k in episodes},
        "adaptive": {k: last_hand_value_adaptive(table, prior, k) for k in episodes},
    }
