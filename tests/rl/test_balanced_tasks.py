"""Balanced opponent draws: each batch holds the population in proportion."""

from __future__ import annotations

from collections import Counter

import pytest

from mage_rl.envs import Population
from mage_rl.graphs.rollouts import sample_tasks

POP = Population.parse("kuhn:conservative=0.3,kuhn:aggressive=0.3,kuhn:intermediate=0.4")


@pytest.mark.parametrize("n", [1, 4, 6, 10, 16])
def test_every_opponent_gets_floor_or_ceil_of_its_share(n: int) -> None:
    for seed in range(20):
        counts = Counter(POP.systematic(n, seed))
        for spec, weight in zip(POP.specs, POP.weights, strict=True):
            assert int(n * weight) <= counts[spec] <= -(-n * weight // 1)
        assert sum(counts.values()) == n


def test_each_draw_keeps_the_population_weights() -> None:
    # Over many batches, the opponent at each position follows the weights.
    draws = Counter(POP.systematic(4, seed)[1] for seed in range(6000))
    for spec, weight in zip(POP.specs, POP.weights, strict=True):
        assert draws[spec] / 6000 == pytest.approx(weight, abs=0.03)


def test_balanced_batches_are_deterministic_and_keep_task_seeds() -> None:
    a = sample_tasks(POP, 6, base_seed=3, iteration=2, balanced=True)
    b = sample_tasks(POP, 6, base_seed=3, iteration=2, balanced=True)
    plain = sample_tasks(POP, 6, base_seed=3, iteration=2)
    assert a == b
    assert [t.seed for t in a] == [t.seed for t in plain]
    assert [t.seat for t in a] == [t.seat for t in plain]
    assert sample_tasks(POP, 6, base_seed=3, iteration=3, balanced=True) != a
