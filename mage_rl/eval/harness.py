"""``mage eval``: several agents under identical conditions, resumable.

1. The conditions (:class:`~mage_rl.eval.conditions.EvalConfig`, whose settings are
   defined once in :mod:`mage_rl.eval.settings`) fix everything but the agent:
   environments, opponent set, ``n`` task instances per environment drawn once with
   :func:`~mage_rl.graphs.rollouts.sample_tasks` from one base seed, K, the episode protocol
   and the sampling settings (default: the paper's evaluation sampling, temperature 0.7,
   top-p 0.8, top-k 20). Each agent plays in its own format (:mod:`mage_rl.players.play_settings`):
   a trained one as its run's config says (graph, layout, context, prompt, decoding,
   token limit, stop rule, dtype), unless a flag overrides it.
2. The run folder (:mod:`mage_rl.eval.eval_folder`) gets ``config.json`` (conditions and
   agents) and ``tasks.json`` (every task instance: seed, opponent, seat). Restarting in
   a folder checks that the conditions are the same; agents may be added.
3. Agents run one after another; each one's meta-episodes run concurrently, so their LLM
   calls share the engine's batches. Each distinct model is loaded once and its engine
   shared by every agent that uses it.
4. Every finished meta-episode is appended to ``records/<agent>/<env>.jsonl`` at once
   (flushed and fsynced). A restart skips the (task seed, rollout) pairs already there,
   so an interruption loses only the meta-episodes in flight.
5. Every LLM call samples with a seed derived from (task seed, rollout, call index):
   the agents meet common random numbers, and a meta-episode's samples do not depend
   on which others shared its batch or on whether the run was resumed.
6. :func:`mage_rl.eval.report.write_run_report` turns the records into
   ``results.json`` (stamped by :func:`mage_rl.provenance.write_results`), ``table.md``
   and ``plots/``.

The names of those modules are importable from here as well.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mage_rl import runtime
from mage_rl.config import RunConfig
from mage_rl.envs import derive_seed
from mage_rl.eval.agents import STYLES, AgentSpec, parse_agents
from mage_rl.eval.conditions import (
    GAME_SHORT,
    OPPONENT_SETS,
    EvalConfig,
    eval_tasks,
    opponent_population,
)
from mage_rl.eval.eval_folder import (
    FORMAT_VERSION,
    RecordLog,
    prepare_run_dir,
    records_path,
    slim,
    tasks_document,
)
from mage_rl.eval.report import write_run_report
from mage_rl.eval.served import play_served
from mage_rl.graphs import MetaEpisodeGraph
from mage_rl.graphs.rollouts import TaskInstance, collect_rollouts
from mage_rl.policy.chat_model import PolicyChatModel, seeded
from mage_rl.records import MetaEpisodeRecord

log = logging.getLogger(__name__)

__all__ = [
    "FORMAT_VERSION",
    "GAME_SHORT",
    "OPPONENT_SETS",
    "STYLES",
    "AgentSpec",
    "EvalConfig",
    "RecordLog",
    "eval_tasks",
    "opponent_population",
    "parse_agents",
    "play_tasks",
    "prepare_run_dir",
    "records_path",
    "run_evaluation",
    "slim",
    "tasks_document",
]


async def play_tasks(
    graph: MetaEpisodeGraph,
    policy: Any,
    cfg: EvalConfig,
    play: RunConfig,
    jobs: Sequence[tuple[TaskInstance, int]],
    label: str,
    on_done: Callable[[MetaEpisodeRecord], None],
) -> None:
    """Play the (task, rollout) ``jobs`` concurrently, in the format of the agent's run
    config ``play``, with the evaluation's sampling; ``on_done`` gets each record as
    soon as its meta-episode ends.

    The loop is training's (:func:`~mage_rl.graphs.rollouts.collect_rollouts`); each
    meta-episode samples from its own stream, seeded by (task seed, rollout) alone, so
    every agent meets common random numbers."""
    llm = PolicyChatModel(
        policy=policy, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
        max_tokens=play.policy.max_tokens,
    )  # fmt: skip
    try:
        await collect_rollouts(
            graph, llm, env_name=play.env.name, tasks=(), group_size=1,
            concurrency=cfg.concurrency, max_turns=play.env.max_turns, on_done=on_done,
            jobs=jobs, agent=label,
            chat_for=lambda task, rollout: seeded(
                llm, derive_seed("eval-sample", task.seed, rollout)
            ),
        )  # fmt: skip
    finally:
        aclose = getattr(policy, "aclose", None)
        if aclose is not None:  # endpoint clients belong to this event loop
            await aclose()


async def play_served_tasks(
    agent: AgentSpec,
    cfg: EvalConfig,
    play: RunConfig,
    jobs: Sequence[tuple[TaskInstance, int]],
    on_done: Callable[[MetaEpisodeRecord], None],
) -> None:
    """Play the ``jobs`` with the agent a server serves (:mod:`mage_rl.eval.served`),
    ``cfg.concurrency`` sessions at a time, the game played here.

    Raises:
        ValueError: The evaluation's K is not the served agent's.
    """
    import os

    import openai

    card = agent.served
    if play.meta.episodes != card.episodes:
        raise ValueError(
            f"agent {agent.label!r} plays {card.episodes} episodes a session on its server; "
            f"evaluate it with --episodes {card.episodes}"
        )
    key = os.environ.get("MAGE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none"
    client = openai.AsyncOpenAI(base_url=card.url, api_key=key, max_retries=0, timeout=600)
    sampling = {"temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k}
    gate = asyncio.Semaphore(cfg.concurrency)

    async def one(task: TaskInstance, rollout: int) -> None:
        async with gate:
            record = await play_served(
                client, card, env_name=play.env.name, task=task, rollout=rollout,
                protocol=play.env.protocol, max_turns=play.env.max_turns,
                sampling=sampling, label=agent.label,
            )  # fmt: skip
        on_done(record)

    try:
        await asyncio.gather(*(one(task, rollout) for task, rollout in jobs))
    finally:
        await client.close()


class _Policies:
    """Each distinct model (with its dtype and engine) loaded once; its engine shared by
    the agents that use it."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}

    def get(self, agent: AgentSpec, play: RunConfig) -> Any:
        p = play.policy
        key = f"{agent.model}#{agent.endpoint_model}" if agent.is_endpoint else agent.model
        key = key if agent.is_endpoint else f"{key}#{p.dtype}#{p.engine}"
        if key not in self._loaded:
            if agent.is_endpoint:
                from mage_rl.policy.openai_client import OpenAIPolicy

                policy: Any = OpenAIPolicy(agent.model, str(agent.endpoint_model))
            else:
                log.info("loading model %s (%s, %s engine)", agent.model, p.dtype, p.engine)
                policy = runtime.build_engine(p)
            self._loaded[key] = policy
        return self._loaded[key]

    def close(self) -> None:
        for policy in self._loaded.values():
            close = getattr(policy, "close", None)
            if close is not None:
                close()
        self._loaded.clear()


def run_evaluation(
    cfg: EvalConfig,
    out_dir: str | Path,
    *,
    progress: bool = True,
    on_record: Callable[[MetaEpisodeRecord], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) an evaluation and write its report.

    Args:
        cfg: Conditions and agents.
        out_dir: The run folder; an existing one is resumed.
        progress: Show a progress bar per (agent, environment).
        on_record: Called with each record after it is saved.

    Returns:
        The run's results (as written to ``results.json``).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    started = time.time()
    out = Path(out_dir)
    tasks = eval_tasks(cfg)
    prepare_run_dir(out, cfg, tasks)
    total = cfg.n * cfg.rollouts
    plan = []
    for agent in cfg.agents:
        for env in cfg.envs:
            logfile = RecordLog(records_path(out, agent.label, env))
            done = {(r.seed, r.rollout) for r in logfile.read()}
            jobs = [
                (t, r) for t in tasks[env] for r in range(cfg.rollouts) if (t.seed, r) not in done
            ]
            plan.append((agent, env, logfile, jobs))
    policies = _Policies()
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, disable=not progress) as bar:
            bars = {
                (agent.label, env): bar.add_task(
                    f"{agent.label} {env}", total=total, completed=total - len(jobs)
                )
                for agent, env, _, jobs in plan
            }
            for agent, env, logfile, jobs in plan:
                if not jobs:
                    continue
                if len(jobs) < total:
                    log.info("%s %s: resuming, %d of %d left", agent.label, env, len(jobs), total)
                bar_id = bars[(agent.label, env)]

                def save(record: MetaEpisodeRecord, logfile=logfile, bar_id=bar_id) -> None:
                    logfile.append(record if cfg.keep_ids else slim(record))
                    bar.advance(bar_id)
                    if on_record is not None:
                        on_record(record)

                play = cfg.agent_config(agent, env)
                if agent.served is not None:
                    asyncio.run(play_served_tasks(agent, cfg, play, jobs, save))
                    continue
                graph = runtime.build_graph(play)
                policy = policies.get(agent, play)
                asyncio.run(play_tasks(graph, policy, cfg, play, jobs, agent.label, save))
    finally:
        policies.close()
    return write_run_report(out, started=started)
