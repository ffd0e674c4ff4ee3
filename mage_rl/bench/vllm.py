"""Rollout throughput: the vLLM engine (``policy.engine: vllm``) versus the local engine.

What it measures, per engine, in one process and one after the other:

1. Start the engine: the local batched engine over the loaded model, or a vLLM server
   (:class:`~mage_rl.policy.vllm_engine.VLLMEngine`, from ``.venv-vllm`` on a CPU). The
   start-up (vLLM loads and compiles the model) is timed apart and not counted. One short
   request warms the engine up.
2. Play ``meta_episodes`` meta-episodes at once (one task instance each, the same task
   seeds for both engines) through the real MAGE graph in the re-rendered layout, with
   free sampling at temperature 1 and at most ``max_tokens`` new tokens per LLM call
   (play and reflect alike).
3. Report wall time, meta-episodes per minute, generated tokens per second, LLM calls,
   the CPU time of this process over wall time (vLLM's own processes are not in it), and
   the machine's 1-minute load average when the rollouts end: on a shared machine a
   load well above the cores in use says the figures are disturbed.

Only one engine runs at a time: the vLLM server is stopped before the local engine
starts, so neither competes with the other for the CPUs. The ratio vLLM / local of
meta-episodes per minute is the claim. The two engines draw different random numbers,
so their games differ; meta-episodes always play all ``episodes`` episodes (no stop on
success), so the number of LLM calls is the same up to the turns each game takes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from mage_rl.policy.base import SamplingParams

logger = logging.getLogger(__name__)

ENGINES = ("vllm", "local")


def bench_vllm(
    model: str = "smollm2",
    meta_episodes: int = 16,
    episodes: int = 3,
    max_tokens: int = 48,
    dtype: str = "auto",
    seed: int = 0,
    engines: Sequence[str] = ENGINES,
    on_meta_episode: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time ``meta_episodes`` concurrent Kuhn Poker meta-episodes on each engine.

    Args:
        model: Model spec (``smollm2`` or an HF directory; vLLM cannot load ``tiny``).
        meta_episodes: Meta-episodes played at once; also each engine's batch limit.
        episodes: K, episodes per meta-episode (all are played).
        max_tokens: Response limit of every LLM call, play and reflect.
        dtype: ``auto``, ``bf16`` or ``fp32``, for both engines.
        seed: Base seed of the task instances (each LLM call draws its own sample).
        engines: Which of ``vllm`` and ``local`` to run, in this order.
        on_meta_episode: Called with the engine name when a meta-episode finishes.

    Returns:
        ``{"config", "engines": {name: {...}}, "ratios"}``; each engine has ``start_s``,
        ``wall_s``, ``meta_episodes_per_min``, ``llm_calls``, ``generated_tokens``,
        ``tokens_per_s``, ``mean_prompt_tokens``, ``mean_response_tokens``,
        ``cpu_cores`` and ``load_1min_after``; ``ratios`` (vllm / local) is empty unless both ran.

    Raises:
        ValueError: On an unknown engine, or ``meta_episodes`` below 1.
        ImportError: If vLLM is asked for and not installed.
    """
    import torch

    from mage_rl import runtime
    from mage_rl.config import RunConfig
    from mage_rl.graphs import agent_graph
    from mage_rl.policy.models import resolve_dtype

    engines = tuple(engines)
    if not engines or any(e not in ENGINES for e in engines) or len(set(engines)) != len(engines):
        raise ValueError(f"engines={list(engines)}: give one or both of {list(ENGINES)}")
    if meta_episodes < 1:
        raise ValueError(f"meta_episodes must be >= 1, got {meta_episodes}")
    cfg = RunConfig.model_validate(
        {
            "env": {"name": "kuhn_poker", "population": "kuhn_train", "seat": "sampled"},
            "meta": {"episodes": episodes, "context": "reflection", "stop_on_success": False,
                     "layout": "rerendered"},
            "policy": {"model": model, "dtype": dtype, "temperature": 1.0,
                       "max_tokens": max_tokens, "max_batch_size": meta_episodes},
            "rollout": {"tasks": meta_episodes, "group_size": 1,
                        "concurrency": meta_episodes, "seed": seed},
        }
    )  # fmt: skip
    options = dataclasses.replace(runtime.graph_options(cfg), reflect_max_tokens=max_tokens)
    graph = agent_graph(cfg.meta.agent, options)
    tasks = runtime.tasks_for(cfg, meta_episodes, base_seed=seed)
    results = {name: _run_engine(name, cfg, graph, tasks, on_meta_episode) for name in engines}
    ratios = {}
    if len(results) == 2:
        for key in ("meta_episodes_per_min", "tokens_per_s"):
            ratios[key] = results["vllm"][key] / max(results["local"][key], 1e-12)
    return {
        "config": {
            "model": model, "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),  # type: ignore[arg-type]
            "env": "kuhn_poker", "population": "kuhn_train", "layout": "rerendered",
            "meta_episodes": meta_episodes, "episodes": episodes, "max_tokens": max_tokens,
            "seed": seed, "torch_threads": torch.get_num_threads(),
        },
        "engines": results,
        "ratios": ratios,
    }  # fmt: skip


def _run_engine(
    name: str,
    cfg: Any,
    graph: Any,
    tasks: list[Any],
    on_meta_episode: Callable[[str], None] | None,
) -> dict[str, Any]:
    """Start one engine, warm it up, play the tasks once; its measurements."""
    from mage_rl import runtime

    policy = cfg.policy.model_copy(update={"engine": name})
    started = time.perf_counter()
    engine = runtime.build_engine(policy)
    start_s = time.perf_counter() - started
    try:
        engine.generate_sync([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=4))
        # Every call draws its own sample (no fixed per-call seed): with one seed for all
        # calls, an answer that leaves the game unchanged repeats itself exactly, and the
        # engine's few distinct samples would set the response lengths being compared.
        llm = runtime.chat_model(engine, temperature=1.0, max_tokens=cfg.policy.max_tokens)
        logger.info("bench vllm: %d meta-episodes on the %s engine", len(tasks), name)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        records = runtime.run_rollouts(
            cfg, graph, llm, tasks, group_size=1,
            on_done=(lambda _r: on_meta_episode(name)) if on_meta_episode else None,
        )  # fmt: skip
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        load = os.getloadavg()[0]
    finally:
        engine.close()
    turns = [t for r in records for t in r.turns]
    tokens = sum(len(t.response_ids) for t in turns)
    return {
        "start_s": start_s,
        "wall_s": wall,
        "meta_episodes": len(records),
        "meta_episodes_per_min": 60.0 * len(records) / wall,
        "llm_calls": len(turns),
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "mean_prompt_tokens": sum(len(t.prompt_ids) for t in turns) / max(len(turns), 1),
        "mean_response_tokens": tokens / max(len(turns), 1),
        "cpu_cores": cpu / wall,
        "load_1min_after": load,
    }


def format_vllm_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_vllm`'s result, one row per engine, then ratios."""
    cfg = result["config"]
    lines = [
        f"Rollout engines: {cfg['meta_episodes']} concurrent {cfg['env']} meta-episodes "
        f"(K={cfg['episodes']}, up to {cfg['max_tokens']} new tokens per call, "
        f"{cfg['layout']} layout), model {cfg['model']} ({cfg['dtype']}), seed {cfg['seed']}",
        "",
        "| engine | start s | wall s | meta-episodes/min | LLM calls | tokens | tokens/s "
        "| mean prompt | mean response | mage CPU cores | load after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in result["engines"].items():
        lines.append(
            f"| {name} | {m['start_s']:.0f} | {m['wall_s']:.1f} | {m['meta_episodes_per_min']:.2f} "
            f"| {m['llm_calls']} | {m['generated_tokens']} | {m['tokens_per_s']:.1f} "
            f"| {m['mean_prompt_tokens']:.0f} | {m['mean_response_tokens']:.1f} "
            f"| {m['cpu_cores']:.2f} | {m.get('load_1min_after', float('nan')):.1f} |"
        )
    ratios = result.get("ratios") or {}
    if ratios:
        lines += [
            "",
            f"vLLM / local: {ratios['meta_episodes_per_min']:.2f}x meta-episodes/min, "
            f"{ratios['tokens_per_s']:.2f}x tokens/s.",
        ]
    return "\n".join(lines)
