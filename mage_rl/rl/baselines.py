"""The evaluations a training run makes before its first update.

``eval.before`` plays the run's own graph with the untrained weights, ``eval.baselines``
other agents on the same base model, all on the run's evaluation tasks
(:func:`~mage_rl.eval.training.eval_tasks`); each is written as ``eval/LABEL.json`` and
``.jsonl``, and with ``eval.cache`` read from the evaluation cache when this machine has
computed it before (:mod:`mage_rl.eval.eval_cache`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from mage_rl import runtime
from mage_rl.eval.eval_cache import (
    EvalCache,
    cache_key,
    key_material,
    tokenizer_digest,
    weights_digest,
)
from mage_rl.eval.training import (
    UNTRAINED,
    baseline_labels,
    eval_tasks,
    summarize_eval,
    write_eval,
)
from mage_rl.graphs import agent_graph
from mage_rl.rl.phases import EVAL_BEFORE

logger = logging.getLogger(__name__)


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
            options = replace(options, constrain_actions=False)
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
