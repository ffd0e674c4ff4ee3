"""Build the pieces a config describes: model, engine, chat model, graph, tasks.

The rollout, training and evaluation commands share these, so a config means the same
thing in each of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mage_rl.config import PolicyConfig, RunConfig
from mage_rl.envs import Population
from mage_rl.envs.base import derive_seed
from mage_rl.graphs import GraphOptions, MetaEpisodeGraph, agent_graph
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.rollout import TaskInstance, collect_rollouts, sample_tasks


def graph_options(cfg: RunConfig) -> GraphOptions:
    """The meta-episode graph options of a config."""
    return GraphOptions(
        num_episodes=cfg.meta.episodes,
        context=cfg.meta.context,
        protocol=cfg.env.protocol,
        stop_on_success=cfg.meta.stop_on_success,
        react=cfg.meta.agent == "react",
        max_tokens=cfg.policy.max_tokens,
        reflect_max_tokens=max(cfg.policy.max_tokens, 2 * cfg.policy.max_tokens),
        prompt=cfg.meta.prompt,
        constrain_actions=cfg.policy.constrain_actions,
    )


def build_graph(cfg: RunConfig) -> MetaEpisodeGraph:
    """The agent graph named by ``meta.agent`` with the config's options.

    Loads the config's plugins first (and those of the command that started this
    process), so a rollout worker in another process knows the names they register.
    """
    from mage_rl.plugins import load_plugins, load_process_plugins

    load_process_plugins()
    load_plugins(cfg.plugins)
    return agent_graph(cfg.meta.agent, graph_options(cfg))


def build_engine(policy: PolicyConfig, model: Any = None, tokenizer: Any = None) -> Any:
    """A batched :class:`~mage_rl.policy.engine.LocalEngine` for ``policy.model``."""
    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model

    if model is None:
        model, tokenizer = load_model(policy.model, dtype=policy.dtype)
    return LocalEngine(model, tokenizer, max_batch_size=policy.max_batch_size, name=policy.model)


def chat_model(
    engine: Any, *, temperature: float, top_p: float = 1.0, top_k: int = 0, max_tokens: int = 96
) -> Any:
    """A LangChain chat model over a policy, with default sampling settings."""
    from mage_rl.policy.chat_model import PolicyChatModel

    return PolicyChatModel(
        policy=engine, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens
    )


def rollout_chat_model(cfg: RunConfig, engine: Any) -> Any:
    """The chat model of training rollouts: the config's ``policy`` sampling settings."""
    p = cfg.policy
    return chat_model(
        engine, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, max_tokens=p.max_tokens
    )


def eval_chat_model(cfg: Any, engine: Any) -> Any:
    """The chat model of periodic evaluation: the ``eval`` section's sampling settings."""
    e = cfg.eval
    return chat_model(
        engine,
        temperature=e.temperature,
        top_p=e.top_p,
        top_k=e.top_k,
        max_tokens=cfg.policy.max_tokens,
    )


def population(cfg: RunConfig) -> Population:
    """The config's opponent population."""
    return Population.parse(cfg.env.population, game=cfg.env.name)


def tasks_for(cfg: RunConfig, n: int, base_seed: int, iteration: int = 0) -> list[TaskInstance]:
    """``n`` task instances drawn from the config's population and seat setting."""
    return sample_tasks(
        population(cfg), n, base_seed=base_seed, iteration=iteration, seat=cfg.env.seat
    )


def training_tasks(cfg: Any, iteration: int) -> tuple[list[TaskInstance], int]:
    """The tasks of one training batch and the rollouts per task.

    Under ``stationary`` grouping (MAGE) each of the B task instances has one opponent and
    is played ``group_size`` times. Under ``mixed`` grouping (the ablation) the G rollouts
    of a task seed each draw their own opponent from the population, so the group that
    shares a baseline spans opponents; every rollout is then its own task instance.
    """
    tasks = tasks_for(cfg, cfg.rollout.tasks, cfg.rollout.seed, iteration)
    if cfg.advantages.grouping != "mixed":
        return tasks, cfg.rollout.group_size
    pop = population(cfg)
    mixed = [
        TaskInstance(task.seed, pop.sample(derive_seed("mixed", task.seed, r)), task.seat, draw=r)
        for task in tasks
        for r in range(cfg.rollout.group_size)
    ]
    return mixed, 1


def run_rollouts(
    cfg: RunConfig,
    graph: MetaEpisodeGraph,
    llm: Any,
    tasks: list[TaskInstance],
    group_size: int,
    on_done: Callable[[MetaEpisodeRecord], None] | None = None,
) -> list[MetaEpisodeRecord]:
    """Collect ``len(tasks) x group_size`` meta-episodes (blocking)."""
    return asyncio.run(
        collect_rollouts(
            graph,
            llm,
            env_name=cfg.env.name,
            tasks=tasks,
            group_size=group_size,
            concurrency=cfg.rollout.concurrency,
            max_turns=cfg.env.max_turns,
            on_done=on_done,
        )
    )
