"""Rollout collection: B task instances x G rollouts of a meta-episode graph.

A *task instance* is (task seed, opponent, seat). Its G rollouts share everything
chance decides (SPEC §5): the task seed fixes every episode's deal and the opponent's
randomness, so the group baseline compares strategies, not luck. All meta-episodes run
concurrently as asyncio tasks (bounded by ``concurrency``); their LLM calls reach the
local engine together and are batched into shared forward passes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from mage_rl.envs import Population, derive_seed, make_env, resolve_seat
from mage_rl.fileio import atomic_write_lines
from mage_rl.graphs.meta_episode import MetaEpisodeGraph
from mage_rl.nodes.state import MetaEpisodeState
from mage_rl.policy.chat_model import PolicyChatModel, seeded
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn, group_id


@dataclass(frozen=True)
class TaskInstance:
    """One group's task: everything the G rollouts share.

    ``draw`` tells apart task instances that are otherwise equal, such as the rollouts
    of a mixed group that drew the same opponent; it salts their sampling seeds only.
    """

    seed: int
    opponent: str
    seat: int
    draw: int = 0


def sample_tasks(
    population: Population,
    n: int,
    *,
    base_seed: int,
    iteration: int = 0,
    seat: int | str = "sampled",
    balanced: bool = False,
) -> list[TaskInstance]:
    """``n`` task instances for one batch, a deterministic function of the seeds.

    The seat is resolved from each task seed. The opponent is drawn from the population
    independently for each task seed, or, with ``balanced``, by systematic sampling over
    the batch: opponent ``j`` of weight ``w_j`` gets ``floor(n * w_j)`` or
    ``ceil(n * w_j)`` of the ``n`` tasks (each task's chance of meeting ``j`` is still
    exactly ``w_j``), in a seeded random order. A (base seed, iteration) pair always
    yields the same batch.
    """
    seeds = [derive_seed("task", base_seed, iteration, i) for i in range(n)]
    if balanced:
        opponents = population.systematic(n, derive_seed("balanced", base_seed, iteration))
    else:
        opponents = [population.sample(seed) for seed in seeds]
    return [
        TaskInstance(seed, opponent, resolve_seat(seat, seed))
        for seed, opponent in zip(seeds, opponents, strict=True)
    ]


def record_from_state(
    state: MetaEpisodeState,
    *,
    task: TaskInstance,
    rollout: int,
    env_name: str,
    agent: str,
    opponent_calls: Sequence[Turn] = (),
) -> MetaEpisodeRecord:
    """Turn a finished graph state into a :class:`MetaEpisodeRecord`; ``opponent_calls``
    are a language-model opponent's calls (:mod:`mage_rl.envs.llm_opponent`)."""
    return MetaEpisodeRecord(
        uid=group_id(env_name, task.seed, task.opponent, task.seat),
        rollout=rollout,
        env=env_name,
        seed=task.seed,
        opponent=task.opponent,
        seat=task.seat,
        episodes=[EpisodeResult(**e) for e in state.get("episodes", [])],
        turns=[Turn.from_dict(t) for t in state.get("turns", [])],
        reflections=list(state.get("memory", [])),
        agent=agent,
        conversation=state.get("conversation_trace"),
        opponent_calls=list(opponent_calls),
    )


async def collect_rollouts(
    graph: MetaEpisodeGraph,
    llm: BaseChatModel,
    *,
    env_name: str,
    tasks: Sequence[TaskInstance],
    group_size: int,
    concurrency: int = 16,
    max_turns: int | None = None,
    on_done: Callable[[MetaEpisodeRecord], None] | None = None,
    jobs: Sequence[tuple[TaskInstance, int]] | None = None,
    chat_for: Callable[[TaskInstance, int], BaseChatModel] | None = None,
    agent: str | None = None,
) -> list[MetaEpisodeRecord]:
    """Play ``len(tasks) x group_size`` meta-episodes concurrently: the one play loop of
    training rollouts, ``mage rollout`` and ``mage eval``.

    Args:
        graph: The agent's meta-episode graph.
        llm: The chat model that drives it.
        env_name: Environment name.
        tasks: Task instances (one group each).
        group_size: G, rollouts per task.
        concurrency: Meta-episodes in flight at once.
        max_turns: Override of the environment's turns per episode.
        on_done: Called with each record as it finishes (progress bars, streaming).
        jobs: The (task, rollout) pairs to play instead of every task x ``group_size``
            (an evaluation resuming skips the finished ones).
        chat_for: The chat model of one meta-episode (an evaluation seeds its own
            streams); default: ``llm`` with one seeded stream per meta-episode.
        agent: The name its records carry (default: the graph's).

    Returns:
        Records ordered as the jobs (by task, then rollout), whatever order they
        finished in.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    gate = asyncio.Semaphore(concurrency)

    def chat(task: TaskInstance, rollout: int) -> BaseChatModel:
        if chat_for is not None:
            return chat_for(task, rollout)
        # A policy chat model without a fixed seed gets one stream per meta-episode, so
        # that a batch's samples do not depend on the order in which concurrent
        # meta-episodes reach the engine: same weights and seeds, same records.
        if isinstance(llm, PolicyChatModel) and llm.seed is None:
            key = (task.seed, task.opponent, task.seat, task.draw, rollout)
            return seeded(llm, derive_seed("rollout-sample", *key))
        return llm

    async def one(task: TaskInstance, rollout: int) -> MetaEpisodeRecord:
        async with gate:
            env = make_env(env_name, task.opponent, seat=task.seat, max_turns=max_turns)
            state = await graph.run(
                env, chat(task, rollout), task_seed=task.seed, opponent=task.opponent
            )
        record = record_from_state(
            state, task=task, rollout=rollout, env_name=env_name, agent=agent or graph.name,
            opponent_calls=getattr(getattr(env, "opponent", None), "calls", ()),
        )  # fmt: skip
        if on_done:
            on_done(record)
        return record

    pairs = jobs if jobs is not None else [(t, r) for t in tasks for r in range(group_size)]
    return list(await asyncio.gather(*(one(t, r) for t, r in pairs)))


def write_jsonl(records: Iterable[MetaEpisodeRecord], path: str | Path) -> Path:
    """Write records as JSON lines, atomically (a temp file renamed into place)."""
    return atomic_write_lines(path, (record.to_json() + "\n" for record in records))


def read_jsonl(path: str | Path) -> list[MetaEpisodeRecord]:
    """Read records written by :func:`write_jsonl`."""
    with Path(path).open() as f:
        return [MetaEpisodeRecord.from_dict(json.loads(line)) for line in f if line.strip()]


def summarize(records: Sequence[MetaEpisodeRecord]) -> dict[str, Any]:
    """Quick numbers for a batch: success rate, mean final reward, invalid share."""
    if not records:
        return {"meta_episodes": 0}
    turns = [t for r in records for t in r.turns]
    acting = [t for t in turns if t.acting]
    return {
        "meta_episodes": len(records),
        "success": sum(any(e.outcome == "won" for e in r.episodes) for r in records) / len(records),
        "final_reward": sum(r.episodes[-1].reward for r in records if r.episodes) / len(records),
        "turns": len(turns),
        "invalid_share": sum(t.invalid for t in acting) / max(1, len(acting)),
        "response_tokens": sum(len(t.response_ids) for t in turns),
    }
