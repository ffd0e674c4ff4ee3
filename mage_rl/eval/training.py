"""Evaluation during training: the fixed tasks, the untrained baselines, the summaries.

A training run evaluates on tasks it never trains on (``eval.seed``):

- ``eval.before``: the run's own graph with the untrained weights, before iteration 1;
- ``eval.baselines``: other agents (``react``, ``reflexion``, any registered one) on the
  same base model, tasks and sampling settings, also before iteration 1;
- every ``eval.every`` iterations and after the last one: the trained policy.

All of them meet exactly the same task instances, so the differences are the agents'.
With ``eval.stratify`` the tasks are a stratified design over opponent, seat and last
deal (:mod:`mage_rl.eval.stratified`), which narrows the ev@k intervals of card games.
Each evaluation is written to ``eval/LABEL.json`` (summary) and ``eval/LABEL.jsonl``
(meta-episodes); :mod:`mage_rl.eval.training_report` turns them into the run's report.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from mage_rl.envs import make_env
from mage_rl.eval.eval_cache import (
    EvalCache,
    cache_key,
    key_material,
    tokenizer_digest,
    weights_digest,
)
from mage_rl.eval.metrics import summarize_records, summarize_with_intervals
from mage_rl.eval.stratified import (
    StratifiedDesign,
    _all_first_deals,
    payoff_range,
    stratified_ev,
    stratified_tasks,
)
from mage_rl.fileio import atomic_write_json, writing
from mage_rl.graphs import agent_graph
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.phases import EVAL_BEFORE
from mage_rl.rl.rollout import TaskInstance, write_jsonl

logger = logging.getLogger(__name__)

UNTRAINED = "untrained"
"""The label of the run's own graph evaluated with the untrained weights."""


def strata_count(cfg: Any) -> int:
    """How many strata a stratified evaluation of ``cfg`` has (opponent x seat x deal)."""
    from mage_rl import runtime

    population = runtime.eval_population(cfg)
    env = make_env(cfg.env.name, population.specs[0], seat=0)
    seats = 2 if cfg.env.seat == "sampled" else 1
    return len(population.specs) * seats * len(_all_first_deals(env.game, 0))


def eval_tasks(
    cfg: Any, count: int | None = None
) -> tuple[list[TaskInstance], StratifiedDesign | None]:
    """The evaluation tasks of a run, and the stratified design when ``eval.stratify``.

    A stratified design plays ``ceil(count / strata)`` tasks (at least 2) in every
    stratum, so its size is ``count`` rounded up to a multiple of the strata. ``count``
    (default ``eval.tasks``) smaller than ``eval.tasks`` gives a subset of its tasks:
    the first ones, or under stratification the first seeds of every stratum.
    """
    from mage_rl import runtime

    count = cfg.eval.tasks if count is None else count
    if not cfg.eval.stratify:
        tasks = runtime.tasks_for(
            cfg, cfg.eval.tasks, cfg.eval.seed, pop=runtime.eval_population(cfg)
        )
        return tasks[:count], None
    per_stratum = max(2, math.ceil(count / strata_count(cfg)))
    design = stratified_tasks(
        cfg.env.name,
        runtime.eval_population(cfg),
        cfg.env.seat,
        per_stratum=per_stratum,
        num_episodes=cfg.meta.episodes,
        protocol=cfg.env.protocol,
        base_seed=cfg.eval.seed,
    )
    return design.tasks, design


def summarize_eval(
    records: list[MetaEpisodeRecord], cfg: Any, design: StratifiedDesign | None
) -> dict[str, Any]:
    """The summary written for one evaluation.

    The top level is :func:`~mage_rl.eval.metrics.summarize_records` (plain rates and
    means, what ``metrics.jsonl`` logs); ``intervals`` holds the same metrics with 95 %
    intervals, and ``stratified`` the stratified ev@k when the design is stratified.
    """
    k = cfg.meta.episodes
    summary = summarize_records(records, k)
    summary["intervals"] = summarize_with_intervals(records, k)
    if design is not None:
        summary["stratified"] = stratified_ev(records, design, k, bounds=payoff_range(cfg.env.name))
    return summary


def write_eval(run_dir: Path, label: str, summary: dict[str, Any], records: list) -> Path:
    """Write ``eval/LABEL.json`` and ``eval/LABEL.jsonl``; returns the summary's path.

    Raises:
        WriteError: A write failed (a full disk, ...).
    """
    out = run_dir / "eval" / f"{label}.json"
    with writing(out):
        atomic_write_json(out, summary)
    with writing(out.with_suffix(".jsonl")):
        write_jsonl(records, out.with_suffix(".jsonl"))
    return out


def baseline_labels(cfg: Any) -> list[str]:
    """The labels of the evaluations made before training, in report order."""
    return ([UNTRAINED] if cfg.eval.before else []) + list(cfg.eval.baselines)


def evaluate_baselines(trainer: Any, progress: Any = None, clock: Any = None) -> list[Path]:
    """Evaluate the untrained graph and the baseline agents, unless done already.

    Runs with the engine's weights as they are, so it must be called before the first
    update. A run that is resumed keeps the files it wrote the first time. The agents of
    ``eval.baselines`` play the first ``eval.baseline_tasks`` of the tasks when that is
    set (see :func:`eval_tasks`). With ``eval.cache`` an evaluation computed before on
    this machine with the same weights, config, tasks and code is read from the cache
    (:mod:`mage_rl.eval.eval_cache`) instead of played again; its summary says so.

    Args:
        trainer: The :class:`~mage_rl.rl.trainer.Trainer`.
        progress: ``fn(label, tasks) -> on_done`` for a progress display, or ``None``.
        clock: The run's :class:`~mage_rl.rl.phases.RunClock`, or ``None``.
    """
    from mage_rl import runtime

    cfg = trainer.cfg
    labels = baseline_labels(cfg)
    paths = [trainer.run_dir / "eval" / f"{label}.json" for label in labels]
    todo = [label for label, path in zip(labels, paths, strict=True) if not path.exists()]
    start = time.perf_counter()  # the cache key's hashing counts to the first evaluation
    identity = _cache_identity(trainer) if todo else None
    for label in todo:
        t0 = start if label == todo[0] else time.perf_counter()
        options = runtime.graph_options(cfg)
        if label == "react" and options.constrain_actions:
            # ReAct writes a Thought line before its action, which a choice among the
            # action tags cannot hold: it answers freely, as it was designed to.
            options = replace(options, constrain_actions=False, answer_lead=False)
        graph = trainer.graph if label == UNTRAINED else agent_graph(label, options)
        tasks, design = trainer.eval_design
        if label != UNTRAINED and 0 < cfg.eval.baseline_tasks < len(tasks):
            tasks, design = eval_tasks(cfg, cfg.eval.baseline_tasks)
        key, material, hit = None, None, None
        if identity is not None:
            dump = cfg.model_dump(mode="json")
            material = key_material(dump, label, tasks, *identity)
            key = cache_key(material)
            hit = EvalCache().load(key)
        if hit is not None:
            summary, records, entry = hit
            computed = float(entry.get("seconds", 0.0))
            summary["cache"] = {
                "hit": True, "key": key, "computed_at": entry.get("computed_at"),
                "computed_seconds": computed, "computed_in": entry.get("run_dir"),
            }  # fmt: skip
            what = f"from the cache (computed in {computed:.1f} s on {entry.get('computed_at')})"
        else:
            on_done = progress(label, len(tasks)) if progress else None
            before = _engine_counts(trainer.engine)
            records = runtime.run_rollouts(cfg, graph, trainer.eval_llm, tasks, 1, on_done)
            summary = summarize_eval(records, cfg, design)
            summary["constrain_actions"] = options.constrain_actions
            computed = time.perf_counter() - t0
            if key is not None and material is not None:
                EvalCache().store(key, material, summary, records, computed, trainer.run_dir)
                summary = {**summary, "cache": {"hit": False, "key": key}}
            what = f"computed{_engine_batches(trainer.engine, before)}"
        write_eval(trainer.run_dir, label, summary, records)
        seconds = time.perf_counter() - t0
        logger.info(
            "evaluation before: %s, %d meta-episodes in %.1f s, %s",
            label, len(records), seconds, what,
        )  # fmt: skip
        if clock is not None:
            clock.add(EVAL_BEFORE + label, seconds, "cached" if hit is not None else None)
            if label == UNTRAINED:  # the evaluation after plays the same tasks
                clock.eval_estimate = computed
    # Iteration 1 starts from the same engine state whether these evaluations ran or came
    # from the cache: the prefix cache they filled would change its floating-point sums.
    prefix_cache = getattr(trainer.engine, "prefix_cache", None)
    if prefix_cache is not None:
        prefix_cache.clear()
    return paths


def _cache_identity(trainer: Any) -> tuple[str, str] | None:
    """``(weights, tokenizer)`` digests of the engine's model for the evaluation cache, or
    ``None`` when ``eval.cache`` is off, the weights are not in this process, or an
    opponent is a language model."""
    if not trainer.cfg.eval.cache:
        return None
    from mage_rl import runtime

    if any(":llm:" in spec for spec in runtime.eval_population(trainer.cfg).specs):
        # A language-model opponent's weights (a run that may still be training) are not
        # in the key: such evaluations are played every time.
        logger.info("evaluation cache: a language-model opponent plays; not used")
        return None
    model = getattr(trainer.engine, "model", None)
    if not isinstance(model, torch.nn.Module):
        logger.info("evaluation cache: the engine's weights are not in this process; not used")
        return None
    return weights_digest(model), tokenizer_digest(trainer.tokenizer)


def _engine_counts(engine: Any) -> tuple[int, int, int] | None:
    stats = getattr(engine, "stats", None)
    return None if stats is None else (stats.requests, stats.steps, stats.step_rows)


def _engine_batches(engine: Any, before: tuple[int, int, int] | None) -> str:
    """How the engine batched the calls since ``before`` (``""`` without its counters)."""
    after = _engine_counts(engine)
    if before is None or after is None:
        return ""
    calls, steps, rows = (a - b for a, b in zip(after, before, strict=True))
    return f" ({calls} engine calls, {steps} sampling steps, mean batch {rows / max(1, steps):.1f})"
