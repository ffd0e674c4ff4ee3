"""Training batches under stationary and mixed grouping."""

from __future__ import annotations

from collections import defaultdict

from mage_rl import runtime
from mage_rl.config import TrainConfig, load_config
from mage_rl.graphs.rollouts import record_from_state
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.advantages import record_group


def _cfg(*overrides: str) -> TrainConfig:
    return load_config("configs/kuhn_adaptation_tiny.yaml", list(overrides), cls=TrainConfig)


def test_stationary_groups_share_one_opponent() -> None:
    tasks, group_size = runtime.training_tasks(_cfg(), 0)
    assert group_size == 8 and len(tasks) == 16
    assert len({t.seed for t in tasks}) == 16


def test_mixed_groups_span_opponents_with_the_same_deals() -> None:
    cfg = _cfg("advantages.grouping=mixed")
    tasks, group_size = runtime.training_tasks(cfg, 0)
    assert group_size == 1 and len(tasks) == 16 * 8
    by_seed = defaultdict(set)
    for task in tasks:
        by_seed[task.seed].add(task.opponent)
    assert len(by_seed) == 16
    assert sum(len(opps) > 1 for opps in by_seed.values()) >= 12
    # Records of one seed fall into one mixed group whatever their opponent.
    records = [
        record_from_state({}, task=t, rollout=0, env_name="kuhn_poker", agent="mage")
        for t in tasks[:8]
    ]
    assert all(isinstance(r, MetaEpisodeRecord) for r in records)
    assert len({record_group(r, "mixed") for r in records}) == 1
    assert len({record_group(r, "stationary") for r in records}) == len(by_seed[tasks[0].seed])
