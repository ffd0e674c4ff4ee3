"""Stratified evaluation: the design covers every stratum with the right deal and weight,
and the estimator matches a computation by hand."""

from __future__ import annotations

import math

import pytest

from mage_rl.envs import Population, make_env
from mage_rl.envs.base import episode_seed
from mage_rl.eval.stats import t_quantile
from mage_rl.eval.stratified import stratified_mean, stratified_tasks


def test_every_stratum_deals_its_last_hand() -> None:
    population = Population.parse("kuhn_train")
    design = stratified_tasks("kuhn_poker", population, "sampled", per_stratum=2,
                              num_episodes=3, protocol="fresh", base_seed=11)  # fmt: skip
    assert len(design.tasks) == 3 * 2 * 6 * 2 == len(design.strata)
    assert len(design.weights) == 36
    assert math.isclose(sum(design.weights.values()), 1.0)
    # Population weight x seat share x deal probability (1/6 for each Kuhn deal).
    conservative = [w for k, w in design.weights.items() if k.startswith("kuhn:conservative")]
    assert all(math.isclose(w, 0.3 * 0.5 / 6) for w in conservative)
    env = make_env("kuhn_poker", "kuhn:conservative", seat=0)
    for task, key in zip(design.tasks, design.strata, strict=True):
        env.reset(episode_seed(task.seed, 2, "fresh"))
        deal = ".".join(str(a.action) for a in env.state.full_history() if a.player < 0)
        assert key == f"{task.opponent}|{task.seat}|{deal}"


def test_stratified_mean_by_hand() -> None:
    values = [1.0, 3.0, -1.0, -2.0, 0.0]
    strata = ["a", "a", "b", "b", "b"]
    est = stratified_mean(values, strata, {"a": 0.25, "b": 0.75})
    assert est.mean == pytest.approx(0.25 * 2.0 + 0.75 * -1.0)
    # s_a^2 = 2, s_b^2 = 1; var = 0.25^2 * 2 / 2 + 0.75^2 * 1 / 3; t with 5 - 2 = 3 dof.
    half = t_quantile(0.95, 3) * math.sqrt(0.0625 + 0.1875)
    assert (est.low, est.high) == pytest.approx((est.mean - half, est.mean + half))
    # Restricted to the strata present, the weights are renormalised.
    assert stratified_mean([2.0, 4.0], ["a", "a"], {"a": 0.25, "b": 0.75}).mean == 3.0


def test_games_without_a_deal_are_stratified_over_opponent_and_seat() -> None:
    pop = Population.parse("ttt_train")
    design = stratified_tasks("tic_tac_toe", pop, "sampled", per_stratum=2,
                              num_episodes=2, protocol="fresh", base_seed=0)  # fmt: skip
    assert len(set(design.strata)) == len(pop.specs) * 2  # every opponent in both seats
    assert len(design.tasks) == 2 * len(set(design.strata))
    assert sum(design.weights.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="per_stratum >= 2"):
        stratified_tasks("kuhn_poker", Population.parse("kuhn_train"), "first", per_stratum=1,
                         num_episodes=2, protocol="fresh", base_seed=0)  # fmt: skip
