"""Exact values of rock-paper-scissors for a population of opponents, by enumeration.

Every opponent is a :data:`~mage_rl.envs.rps.Model`: the distribution of its next move
given the earlier rounds (both players' moves). An opponent may ignore the history (a
habit), follow its own moves (a cycle), react to the agent's previous move or to its own
previous result; the values below hold for any of them, because they enumerate every
history the agent and the population can produce. All values are per round, in wins
minus losses (+1, 0, -1), averaged over the population's weights.

- **Best fixed**: the best constant move (the same move every round, whatever it saw).
  Against opponents that ignore the history this is the best answer to the pooled move
  distribution; against reactive ones a constant move is also what they react to.
- **Bayes value of round t** (``bayes_by_round``): the most any policy can earn in round
  t when the rounds before it are played to serve round t (the final-episode objective
  with K = t): the agent may spend earlier rounds on moves that tell the opponents apart
  or that set up a reactive opponent's next move.
- **Greedy play with memory** (``greedy_by_round``): every round best-responds to the
  posterior predictive of the opponent's next move, ties split evenly.
- **Ceiling**: per opponent, the Bayes value of the last round when the agent knows which
  opponent it faces (not its random draws), averaged over the population.
- **The previous-move rule** (``rule_by_round``): from round 2 on, play the move that
  beats the opponent's previous move (round 1: each move 1 in 3). It is what an agent
  trained against constant habits learns (the main job); its value against another
  population says how far that one rule goes there without any model of the opponent.

:func:`rps_values` computes them all; ``mage oracle rps`` prints them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mage_rl.envs.rps import GAME, MOVES, Model, Round, family_of, opponent_model, payoff

PAYOFF = np.array([[payoff(a, b) for b in range(3)] for a in range(3)], dtype=float)
"""PAYOFF[mine, theirs]: +1, 0 or -1."""
WIN = (PAYOFF > 0).astype(float)
TIE = 1e-12


@dataclass
class RpsValues:
    """Exact values for a population, per round in wins minus losses.

    Attributes:
        population: Opponent spec -> weight (normalised).
        episodes: K, the rounds of a meta-episode.
        best_fixed: The last round's value of the best constant move.
        best_fixed_move: That move.
        fixed_by_round: Its value in each round 1..K.
        best_response: Per opponent, the Bayes value of the last round knowing it.
        ceiling: The population mean of ``best_response``.
        bayes_last: The Bayes value of the last round (``bayes_by_round[-1]``).
        bayes_by_round: The Bayes value of each round 1..K (see the module docstring).
        bayes_last_by_opponent: The last round's Bayes play (for the whole population)
            against each opponent: what it earns there, not knowing which it faces.
        greedy_by_round: The value of each round under greedy play with memory.
        win_best_fixed, win_bayes_last: The win rates of the best constant move in the
            last round and of the last round's Bayes play (ties to the first move).
        rule_by_round: The value of each round under the previous-move rule (see the
            module docstring).
        families: Per opponent family present (:data:`~mage_rl.envs.rps.FAMILIES`;
            ``other`` for opponents outside them): its ``weight`` in the population, the
            last round's Bayes play against it (``bayes_last``, the population's play,
            not knowing the family), its ``ceiling`` and the previous-move rule's last
            round against it (``rule_last``).
    """

    population: dict[str, float]
    episodes: int
    best_fixed: float
    best_fixed_move: str
    fixed_by_round: list[float]
    best_response: dict[str, float]
    ceiling: float
    bayes_last: float
    bayes_by_round: list[float]
    bayes_last_by_opponent: dict[str, float]
    greedy_by_round: list[float]
    win_best_fixed: float
    win_bayes_last: float
    rule_by_round: list[float]
    families: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clean(x: float) -> float:
    """``x`` without float noise below 1e-12 (no ``-0.0`` for a value that is 0)."""
    return round(float(x), 12) + 0.0


def _probs(models: Sequence[Model], history: tuple[Round, ...]) -> np.ndarray:
    """(opponents, 3): each opponent's next-move distribution after ``history``."""
    return np.array([model(history) for model in models], dtype=float)


def _constant(models: Sequence[Model], weights: np.ndarray, move: int, k: int) -> np.ndarray:
    """(k, 2): value and win rate of each round when the agent always plays ``move``."""
    out = np.zeros((k, 2))

    def walk(history: tuple[Round, ...], w: np.ndarray) -> None:
        t = len(history)
        if t == k:
            return
        p = _probs(models, history)
        for o in range(3):
            branch = w * p[:, o]
            mass = float(branch.sum())
            if mass <= 0:
                continue
            out[t] += mass * np.array([PAYOFF[move, o], WIN[move, o]])
            walk((*history, (move, o)), branch)

    walk((), weights)
    return out


def _bayes(
    models: Sequence[Model], weights: np.ndarray, target: int
) -> tuple[np.ndarray, np.ndarray]:
    """The most round ``target`` can earn, earlier rounds chosen for it (among equal
    values the first move): that play's value and win rate in round ``target`` against
    each opponent, weighted by the opponent's prior (they sum to the population's)."""

    def best(history: tuple[Round, ...], w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = _probs(models, history)
        if len(history) == target - 1:
            per_value = (w[:, None] * p) @ PAYOFF.T  # (opponents, my move)
            per_win = (w[:, None] * p) @ WIN.T
            totals = per_value.sum(axis=0)
            m = int(np.argmax(totals > totals.max() - TIE))
            return per_value[:, m], per_win[:, m]
        predictive = w @ p
        top: tuple[np.ndarray, np.ndarray] | None = None
        for m in range(3):
            value, win = np.zeros(len(w)), np.zeros(len(w))
            for o in range(3):
                if predictive[o] <= 0:
                    continue
                v, r = best((*history, (m, o)), w * p[:, o])
                value, win = value + v, win + r
            if top is None or value.sum() > top[0].sum() + TIE:
                top = (value, win)
        assert top is not None
        return top

    return best((), weights)


def previous_move_rule(history: tuple[Round, ...]) -> int | None:
    """The move that beats the opponent's previous move; ``None`` (each move 1 in 3) in
    the first round."""
    return (history[-1][1] + 1) % 3 if history else None


def _rule(models: Sequence[Model], k: int) -> np.ndarray:
    """(opponents, k): the value of each round of :func:`previous_move_rule` against each
    opponent."""
    out = np.zeros((len(models), k))

    def walk(history: tuple[Round, ...], w: np.ndarray) -> None:
        t = len(history)
        if t == k:
            return
        p = _probs(models, history)
        move = previous_move_rule(history)
        for m in range(3) if move is None else (move,):
            share = 1 / 3 if move is None else 1.0
            for o in range(3):
                branch = w * share * p[:, o]
                if branch.sum() <= 0:
                    continue
                out[:, t] += branch * PAYOFF[m, o]
                walk((*history, (m, o)), branch)

    walk((), np.ones(len(models)))
    return out


def _greedy(models: Sequence[Model], weights: np.ndarray, k: int) -> list[float]:
    """The value of each round when every round best-responds to the posterior
    predictive of the next move, moves of equal value taken with equal chance."""
    out = [0.0] * k

    def walk(history: tuple[Round, ...], w: np.ndarray, share: float) -> None:
        t = len(history)
        if t == k:
            return
        p = _probs(models, history)
        predictive = w @ p
        values = PAYOFF @ predictive
        chosen = [m for m in range(3) if values[m] > values.max() - TIE]
        for m in chosen:
            out[t] += share * float(values[m]) / len(chosen)
            for o in range(3):
                if predictive[o] > 0:
                    walk((*history, (m, o)), w * p[:, o], share / len(chosen))

    walk((), weights, 1.0)
    return out


def rps_values(population: dict[str, float], episodes: int = 3) -> RpsValues:
    """Exact values of :class:`RpsValues` for ``population`` (spec -> weight).

    Raises:
        ValueError: An opponent of another game or an unknown one, or ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    specs, weights, models = [], [], []
    total = sum(population.values())
    for spec, weight in population.items():
        game, _, name = spec.partition(":")
        if game not in ("rps", GAME):
            raise ValueError(f"{spec!r} is not a rock-paper-scissors opponent")
        specs.append(f"{GAME}:{name}")
        weights.append(weight / total)
        models.append(opponent_model(name))
    w = np.asarray(weights)
    k = episodes
    fixed = [_constant(models, w, move, k) for move in range(3)]
    move = int(np.argmax([f[-1, 0] > max(g[-1, 0] for g in fixed) - TIE for f in fixed]))
    bayes = [_bayes(models, w, t) for t in range(1, k + 1)]
    last, last_wins = bayes[-1]
    alone = {
        s: _clean(_bayes([m], np.ones(1), k)[0][0]) for s, m in zip(specs, models, strict=True)
    }
    rule = _rule(models, k)  # (opponents, k), each opponent alone
    families: dict[str, dict[str, float]] = {}
    by_opponent = {s: _clean(v / wt) for s, v, wt in zip(specs, last, weights, strict=True)}
    for i, (spec, weight) in enumerate(zip(specs, weights, strict=True)):
        entry = families.setdefault(
            family_of(spec) or "other",
            {"weight": 0.0, "bayes_last": 0.0, "ceiling": 0.0, "rule_last": 0.0},
        )
        entry["weight"] += weight
        entry["bayes_last"] += weight * by_opponent[spec]
        entry["ceiling"] += weight * alone[spec]
        entry["rule_last"] += weight * rule[i, -1]
    for entry in families.values():
        for key in ("bayes_last", "ceiling", "rule_last"):
            entry[key] = _clean(entry[key] / entry["weight"])
    return RpsValues(
        population=dict(zip(specs, weights, strict=True)),
        episodes=k,
        best_fixed=_clean(fixed[move][-1, 0]),
        best_fixed_move=MOVES[move],
        fixed_by_round=[_clean(v) for v in fixed[move][:, 0]],
        best_response=alone,
        ceiling=_clean(sum(wt * alone[s] for s, wt in zip(specs, weights, strict=True))),
        bayes_last=_clean(last.sum()),
        bayes_by_round=[_clean(v.sum()) for v, _ in bayes],
        bayes_last_by_opponent={
            s: _clean(v / wt) for s, v, wt in zip(specs, last, weights, strict=True)
        },
        greedy_by_round=[_clean(v) for v in _greedy(models, w, k)],
        win_best_fixed=_clean(fixed[move][-1, 1]),
        win_bayes_last=_clean(last_wins.sum()),
        rule_by_round=[_clean(v) for v in w @ rule],
        families=families,
    )
