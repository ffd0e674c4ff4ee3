"""Exact evaluation of the adaptation study: every deal sequence, every opponent.

The policy decodes greedily and the training opponents are deterministic, so the
outcome of a meta-episode is a function of its K deals. Under the ``fresh`` protocol
there are ``6**K`` deal sequences of Kuhn Poker (the agent's card and the opponent's);

1. :func:`deal_sequence_seeds` finds one task seed per sequence (a task seed fixes every
   episode's deal);
2. :func:`exact_eval_tasks` pairs each of them with each opponent of the population, with
   the opponent's weight spread over the sequences;
3. :func:`exact_ev` turns the played records into the population-weighted expected chips
   of every episode index (``ev@k``), overall and per opponent: exact values, with no
   sampling noise.

:func:`reference_values` gives the oracle values (SPEC §9) the curves are read against.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from itertools import product
from typing import TYPE_CHECKING, Any

from mage_rl.graphs.rollouts import TaskInstance

if TYPE_CHECKING:
    from mage_rl.config import TrainConfig
    from mage_rl.records import MetaEpisodeRecord


def deal_sequence_seeds(num_episodes: int, max_scan: int = 1_000_000) -> list[int]:
    """One task seed for each of the ``6**K`` sequences of Kuhn deals under ``fresh``.

    A task seed fixes every episode's deal (:func:`~mage_rl.envs.base.episode_seed`);
    this scans seeds until each sequence of (agent card, opponent card) deals has one.
    The deal does not depend on the seat or the opponent.

    Raises:
        RuntimeError: If ``max_scan`` seeds do not cover every sequence.
    """
    from mage_rl.envs import make_env
    from mage_rl.envs.base import episode_seed

    env = make_env("kuhn_poker", "kuhn:conservative", seat=0)
    deals = list(product(range(3), repeat=2))
    deals = [d for d in deals if d[0] != d[1]]
    wanted = {seq: -1 for seq in product(deals, repeat=num_episodes)}
    missing = len(wanted)
    for seed in range(max_scan):
        seq = []
        for k in range(num_episodes):
            env.reset(episode_seed(seed, k, "fresh"))
            history = env.state.history()
            seq.append((int(history[0]), int(history[1])))
        key = tuple(seq)
        if wanted[key] < 0:
            wanted[key] = seed
            missing -= 1
            if missing == 0:
                return [wanted[k] for k in sorted(wanted)]
    raise RuntimeError(f"{max_scan} seeds did not cover all {len(wanted)} deal sequences")


def exact_eval_tasks(
    cfg: TrainConfig, seat: int, seeds: Sequence[int]
) -> tuple[list[TaskInstance], list[float]]:
    """Every deal sequence against every opponent, with its population weight."""
    from mage_rl import runtime

    population = runtime.population(cfg)
    tasks, weights = [], []
    for spec, weight in zip(population.specs, population.weights, strict=True):
        for seed in seeds:
            tasks.append(TaskInstance(seed, spec, seat))
            weights.append(float(weight) / len(seeds))
    return tasks, weights


def exact_ev(
    records: Sequence[MetaEpisodeRecord], weights: Sequence[float], num_episodes: int
) -> dict[str, Any]:
    """Population-weighted chips per episode index, overall and per opponent."""
    by_task = {(r.seed, r.opponent): r for r in records}
    if len(by_task) != len(records):
        raise ValueError("exact evaluation needs one record per (seed, opponent)")
    ev = [0.0] * num_episodes
    per_opponent: dict[str, list[float]] = {}
    opp_weight: dict[str, float] = {}
    invalid = 0
    for record, weight in zip(records, weights, strict=True):
        payoffs = [float(e.payoff or 0.0) for e in record.episodes]
        if len(payoffs) != num_episodes:
            raise ValueError(
                f"record {record.uid} played {len(payoffs)} episodes, expected {num_episodes} "
                "(meta.stop_on_success must be false for the study)"
            )
        invalid += sum(t.invalid for t in record.turns)
        rows = per_opponent.setdefault(record.opponent, [0.0] * num_episodes)
        opp_weight[record.opponent] = opp_weight.get(record.opponent, 0.0) + weight
        for k, payoff in enumerate(payoffs):
            ev[k] += weight * payoff
            rows[k] += weight * payoff
    return {
        "ev_by_episode": ev,
        "ev_by_opponent": {
            spec: [v / opp_weight[spec] for v in rows] for spec, rows in per_opponent.items()
        },
        "invalid_turns": invalid,
    }


def reference_values() -> dict[str, dict[str, float]]:
    """Oracle values of SPEC §9 for the training population, per seat.

    They depend on nothing but the built-in population, so they are computed once per
    process (the Bayes enumeration takes seconds); each call gets its own copy.
    """
    return {seat: dict(values) for seat, values in _reference_values().items()}


@cache
def _reference_values() -> dict[str, dict[str, float]]:
    from mage_rl.envs import Population
    from mage_rl.eval.bayes import bayes_last_hand
    from mage_rl.eval.oracles import kuhn_oracle

    population = Population.parse("kuhn_train", game="kuhn_poker")
    oracle = kuhn_oracle(population)
    out: dict[str, dict[str, float]] = {}
    for index, seat in enumerate(oracle.seats):
        bayes = bayes_last_hand(population, index, (2, 3, 4, 5))
        out[seat.seat] = {
            "nash": seat.nash,
            "best_fixed": seat.best_fixed,
            "ceiling": seat.ceiling,
            "target": (seat.best_fixed + seat.ceiling) / 2,
            **{f"bayes_last_hand_k{k}": v for k, v in bayes["adaptive"].items()},
        }
    return out
