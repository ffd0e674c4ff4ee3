"""Training rollouts sample from one seed stream per meta-episode, so a batch's samples
do not depend on the order in which concurrent meta-episodes reach the engine."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

from mage_rl import runtime
from mage_rl.config import TrainConfig, load_config
from mage_rl.envs import Population
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.graphs.rollouts import collect_rollouts, sample_tasks
from mage_rl.policy.base import Generation, Message, SamplingParams
from mage_rl.policy.chat_model import PolicyChatModel


class SeedRecorder:
    """Answers a random legal-looking action, drawn from the request's seed, after a
    random delay, and records every seed it is given."""

    name = "seed-recorder"

    def __init__(self, jitter: int) -> None:
        self.seeds: list[int | None] = []
        self.delays = random.Random(jitter)

    async def generate(self, messages: list[Message], params: SamplingParams) -> Generation:
        self.seeds.append(params.seed)
        await asyncio.sleep(self.delays.random() / 1000)
        action = random.Random(params.seed).choice(["PASS", "BET"])
        return Generation(text=f"<action>{action}</action>")


def _play(jitter: int, concurrency: int, llm_seed: int | None = None):
    policy = SeedRecorder(jitter)
    llm = PolicyChatModel(policy=policy, temperature=1.0, max_tokens=16, seed=llm_seed)
    graph = mage_graph(GraphOptions(num_episodes=3, stop_on_success=False, context="history"))
    tasks = sample_tasks(Population.parse("kuhn_train"), 3, base_seed=5, seat=0)
    records = asyncio.run(
        collect_rollouts(
            graph, llm, env_name="kuhn_poker", tasks=tasks, group_size=3, concurrency=concurrency
        )
    )
    return policy, records


def test_samples_do_not_depend_on_scheduling() -> None:
    _, first = _play(jitter=1, concurrency=9)
    _, second = _play(jitter=2, concurrency=2)
    assert [[t.text for t in r.turns] for r in first] == [[t.text for t in r.turns] for r in second]


def test_every_meta_episode_has_its_own_stream() -> None:
    policy, records = _play(jitter=0, concurrency=9)
    assert None not in policy.seeds and len(set(policy.seeds)) == len(policy.seeds)
    # The rollouts of a group differ (they share deals and opponent, not samples).
    by_group = defaultdict(set)
    for record in records:
        by_group[record.uid].add(tuple(t.text for t in record.turns))
    assert all(len(plays) > 1 for plays in by_group.values())


def test_a_fixed_seed_on_the_chat_model_is_kept() -> None:
    policy, _ = _play(jitter=0, concurrency=9, llm_seed=7)
    assert set(policy.seeds) == {7}


def test_mixed_draws_of_the_same_opponent_get_their_own_streams() -> None:
    cfg = load_config(
        "configs/kuhn_adaptation_tiny.yaml", ["advantages.grouping=mixed"], cls=TrainConfig
    )
    tasks, _ = runtime.training_tasks(cfg, 0)
    same = defaultdict(list)
    for task in tasks:
        same[(task.seed, task.opponent)].append(task.draw)
    # With 8 draws from 3 opponents, some seed draws one opponent more than once.
    repeated = [draws for draws in same.values() if len(draws) > 1]
    assert repeated and all(len(set(d)) == len(d) for d in repeated)
