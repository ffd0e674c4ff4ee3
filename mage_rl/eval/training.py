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
from pathlib import Path
from typing import Any

from mage_rl.envs import make_env
from mage_rl.eval.metrics import summarize_records, summarize_with_intervals
from mage_rl.eval.stratified import (
    StratifiedDesign,
    _all_first_deals,
    payoff_range,
    stratified_ev,
    stratified_tasks,
)
from mage_rl.fileio import atomic_write_json, writing
from mage_rl.graphs.rollouts import TaskInstance, write_jsonl
from mage_rl.records import MetaEpisodeRecord

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
