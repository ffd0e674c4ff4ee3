"""Rollout throughput: batched versus sequential decoding of concurrent meta-episodes.

What it measures, per mode:

1. Load the model once; both modes sample from the same weights.
2. Build a :class:`~mage_rl.policy.engine.LocalEngine` for the mode: ``batched`` puts up
   to ``meta_episodes`` concurrent requests into one forward pass, ``sequential``
   decodes them one at a time (``batched=False``). One short request warms the engine
   up (thread start, first-call kernel set-up) before the clock starts.
3. Play ``meta_episodes`` meta-episodes at once (one task instance each, the same task
   seeds in both modes) through the real MAGE graph and
   :class:`~mage_rl.policy.chat_model.PolicyChatModel`, as ``mage rollout`` does.
4. Report wall time, meta-episodes per minute, generated tokens per second (response
   tokens of every turn record), LLM calls, and the share of wall time spent outside the
   model: wall time minus the engine's ``stats.compute_seconds`` (time inside decode
   batches), i.e. graph and environment code, prompt rendering, and batch collection.

The ratio batched / sequential of meta-episodes per minute and of tokens per second is
the claim; absolute figures depend on the machine and on what else runs on it.

Every LLM call samples with the same fixed seed (``runtime.chat_model(seed=...)``), so a
response depends only on its prompt and both modes play the same games with the same
number of calls and tokens, up to rare last-bit differences of padded batches (the
report shows each mode's counts). Meta-episodes always play all ``episodes`` episodes
(no stop on success), so the amount of work does not hinge on who wins.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mage_rl.policy.base import SamplingParams

if TYPE_CHECKING:
    from mage_rl.policy.models import DType

MODES = ("batched", "sequential")
# The population each benchmarked environment plays: opponents, or Sokoban's room variants.
POPULATIONS = {"kuhn_poker": "kuhn_train", "tic_tac_toe": "ttt_train", "sokoban": "sokoban_train"}

logger = logging.getLogger(__name__)


def bench_rollout(
    model: str = "smollm2",
    meta_episodes: int = 16,
    env: str = "kuhn_poker",
    episodes: int = 3,
    max_tokens: int = 32,
    dtype: DType = "auto",
    modes: Sequence[str] = MODES,
    seed: int = 0,
    rounds: int = 1,
    on_meta_episode: Callable[[str], None] | None = None,
    prefix_cache_mb: float = 1024,
    layout: str = "rerendered",
) -> dict[str, Any]:
    """Time ``meta_episodes`` concurrent meta-episodes in each decoding mode.

    Args:
        model: Model spec for :func:`~mage_rl.policy.models.load_model` (``smollm2``,
            ``tiny`` or a path).
        meta_episodes: Meta-episodes played at once (one task instance each); also the
            batched engine's ``max_batch_size``. More gives batching more to share, and
            makes the sequential mode proportionally slower.
        env: ``kuhn_poker``, ``tic_tac_toe`` or ``sokoban`` (with its training population or rooms).
        episodes: K, episodes per meta-episode (all are played).
        max_tokens: Response limit of play turns; reflect turns get twice as many, as in
            training (``configs/kuhn_smollm2.yaml`` uses 32).
        dtype: Model dtype: ``auto``, ``bf16`` or ``fp32``.
        modes: Which of ``batched`` and ``sequential`` to run, in this order.
        seed: Base seed of the task instances and the sampler seed of every call.
        rounds: Times each mode runs, the modes alternating; each mode reports its
            fastest round. Other processes can only add time, so on a shared machine the
            fastest round is the best estimate of the machine's own speed (as ``timeit``
            reports the minimum).
        on_meta_episode: Called with the mode name each time a meta-episode finishes
            (for progress bars).
        prefix_cache_mb: The timed engines' prefix cache (0 turns prefix reuse off);
            each round of each mode starts with an empty one.
        layout: Prompt layout of the meta-episodes: ``rerendered`` or ``conversation``.

    Returns:
        ``{"config": {...}, "modes": {mode: {...}}, "ratios": {...}}``. Each mode has
        ``wall_s``, ``meta_episodes_per_min``, ``llm_calls``, ``generated_tokens``,
        ``tokens_per_s``, ``model_s``, ``outside_model_share``, ``batches``,
        ``mean_batch``, ``largest_batch``, ``forward_passes``, ``mean_prompt_tokens``,
        ``prefilled_tokens``, ``reused_tokens`` (prompt tokens prefilled and reused),
        ``mean_response_tokens``, ``cpu_cores`` (process CPU time over wall time; well
        under ``torch_threads`` hints at other processes competing for the CPUs) and
        ``round_wall_s`` (the wall time of every round). ``ratios`` (batched / sequential of
        ``meta_episodes_per_min`` and ``tokens_per_s``) is empty unless both modes ran.

    Raises:
        ValueError: On an unknown mode or environment, or ``meta_episodes`` or ``rounds``
            below 1.
    """
    import torch

    from mage_rl.policy.models import resolve_dtype

    modes = tuple(modes)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise ValueError(
            f"modes={list(modes)}: give one or both of {list(MODES)}, each at most once"
        )
    if env not in POPULATIONS:
        raise ValueError(f"env={env!r} is not benchmarked; use one of {sorted(POPULATIONS)}")
    if meta_episodes < 1:
        raise ValueError(f"meta_episodes must be >= 1, got {meta_episodes}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")

    cfg, lm, tokenizer, graph, tasks = rollout_setup(
        model, meta_episodes, env, episodes, max_tokens, dtype, seed, layout
    )
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode in modes:
            runs[mode].append(
                _run_mode(
                    cfg,
                    mode,
                    lm,
                    tokenizer,
                    graph,
                    tasks,
                    seed,
                    on_meta_episode,
                    prefix_cache_mb,
                )  # fmt: skip
            )
    results = {}
    for mode, done in runs.items():
        fastest = min(done, key=lambda r: r["wall_s"])
        results[mode] = {**fastest, "round_wall_s": [r["wall_s"] for r in done]}
    ratios = {}
    if "batched" in results and "sequential" in results:
        for key in ("meta_episodes_per_min", "tokens_per_s"):
            ratios[key] = results["batched"][key] / max(results["sequential"][key], 1e-12)
    return {
        "config": {
            "model": model,
            "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
            "env": env,
            "population": POPULATIONS[env],
            "meta_episodes": meta_episodes,
            "episodes": episodes,
            "max_tokens": max_tokens,
            "seed": seed,
            "rounds": rounds,
            "torch_threads": torch.get_num_threads(),
            "prefix_cache_mb": prefix_cache_mb,
            "layout": layout,
        },
        "modes": results,
        "ratios": ratios,
    }


def rollout_setup(
    model: str,
    meta_episodes: int,
    env: str,
    episodes: int,
    max_tokens: int,
    dtype: DType,
    seed: int,
    layout: str = "rerendered",
    prompt: str = "standard",
    constrain: bool = False,
) -> tuple[Any, Any, Any, Any, list[Any]]:
    """The run config, model, tokenizer, graph and tasks that a rollout benchmark plays.

    ``prompt`` is the play prompt's style (``standard`` or ``compact``) and ``constrain``
    turns constrained decoding of the action on.

    Raises:
        ValueError: On an environment that is not benchmarked, or a config the runtime
            refuses (a conversation layout that could outgrow the model's context).
    """
    from mage_rl import runtime
    from mage_rl.config import RunConfig
    from mage_rl.envs.registry import env_spec
    from mage_rl.policy.models import load_model

    if env not in POPULATIONS:
        raise ValueError(f"env={env!r} is not benchmarked; use one of {sorted(POPULATIONS)}")
    seat = "first" if env_spec(env).single_agent else "sampled"
    cfg = RunConfig.model_validate(
        {
            "env": {"name": env, "population": POPULATIONS[env], "seat": seat},
            "meta": {
                "episodes": episodes,
                "context": "reflection",
                "stop_on_success": False,
                "layout": layout,
                "prompt": prompt,
            },
            "policy": {
                "model": model,
                "dtype": dtype,
                "temperature": 1.0,
                "max_tokens": max_tokens,
                "max_batch_size": meta_episodes,
                "constrain_actions": constrain,
            },
            "rollout": {
                "tasks": meta_episodes,
                "group_size": 1,
                "concurrency": meta_episodes,
                "seed": seed,
            },
        }
    )
    lm, tokenizer = load_model(model, dtype=dtype)
    graph = runtime.build_graph(cfg)
    tasks = runtime.tasks_for(cfg, meta_episodes, base_seed=seed)
    return cfg, lm, tokenizer, graph, tasks


def _run_mode(
    cfg: Any,
    mode: str,
    lm: Any,
    tokenizer: Any,
    graph: Any,
    tasks: list[Any],
    seed: int,
    on_meta_episode: Callable[[str], None] | None,
    prefix_cache_mb: float = 1024,
    records_out: list[Any] | None = None,
) -> dict[str, Any]:
    """Play the tasks once with an engine in ``mode``; the measurements of one mode.

    The meta-episode records are appended to ``records_out`` when it is given.
    """
    from mage_rl import runtime
    from mage_rl.policy.engine import LocalEngine

    batched = mode == "batched"
    # Warm up on a throwaway engine: first-call kernel set-up is paid by the process, and
    # closing the engine joins its worker, so the timed engine's stats start at zero
    # (an engine updates compute_seconds just after answering a batch's last request).
    with LocalEngine(lm, tokenizer, batched=batched, seed=seed) as warm:
        warm.generate_sync([{"role": "user", "content": "Hello"}], SamplingParams(max_tokens=4))
    with LocalEngine(
        lm,
        tokenizer,
        max_batch_size=len(tasks),
        batched=batched,
        seed=seed,
        name=f"{cfg.policy.model}-{mode}",
        prefix_cache_mb=prefix_cache_mb,
    ) as engine:
        llm = runtime.chat_model(
            engine, temperature=cfg.policy.temperature, max_tokens=cfg.policy.max_tokens, seed=seed
        )
        logger.info("bench rollout: %d meta-episodes, %s", len(tasks), mode)
        start, cpu_start = time.perf_counter(), time.process_time()
        records = runtime.run_rollouts(
            cfg,
            graph,
            llm,
            tasks,
            group_size=1,
            on_done=(lambda _r: on_meta_episode(mode)) if on_meta_episode else None,
        )
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    stats = engine.stats  # final: leaving the block joined the worker
    if records_out is not None:
        records_out.extend(records)
    turns = [t for r in records for t in r.turns]
    tokens = sum(len(t.response_ids) for t in turns)
    model_s = stats.compute_seconds
    out = {
        "max_batch_size": engine.max_batch_size,
        "wall_s": wall,
        "meta_episodes": len(records),
        "meta_episodes_per_min": 60.0 * len(records) / wall,
        "llm_calls": len(turns),
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "model_s": model_s,
        "outside_model_share": max(0.0, 1.0 - model_s / wall),
        "batches": stats.batches,
        "mean_batch": stats.mean_batch,
        "largest_batch": stats.largest_batch,
        "forward_passes": stats.forward_passes,
        "mean_prompt_tokens": sum(len(t.prompt_ids) for t in turns) / max(len(turns), 1),
        "prefilled_tokens": stats.prompt_tokens,
        "reused_tokens": stats.reused_tokens,
        "mean_response_tokens": tokens / max(len(turns), 1),
        "cpu_cores": cpu / wall,
    }
    logger.info(
        "bench rollout %s: %.1fs, %.1f meta-episodes/min, %.1f tokens/s",
        mode,
        wall,
        out["meta_episodes_per_min"],
        out["tokens_per_s"],
    )
    return out


def format_rollout_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_rollout`'s result, one row per mode, then ratios."""
    cfg = result["config"]
    lines = [
        f"Rollout: {cfg['meta_episodes']} concurrent {cfg['env']} meta-episodes "
        f"(K={cfg['episodes']}, max_tokens={cfg['max_tokens']}), model {cfg['model']} "
        f"({cfg['dtype']}), {cfg['torch_threads']} torch threads, seed {cfg['seed']}, "
        f"fastest of {cfg['rounds']} round(s) per mode",
        "",
        "| mode | max batch | wall s | meta-episodes/min | LLM calls | tokens | tokens/s "
        "| mean batch | outside model | CPU cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, m in result["modes"].items():
        lines.append(
            f"| {mode} | {m['max_batch_size']} | {m['wall_s']:.1f} "
            f"| {m['meta_episodes_per_min']:.2f} | {m['llm_calls']} | {m['generated_tokens']} "
            f"| {m['tokens_per_s']:.1f} | {m['mean_batch']:.1f} "
            f"| {100 * m['outside_model_share']:.1f}% | {m['cpu_cores']:.2f} |"
        )
    ratios = result.get("ratios") or {}
    if ratios:
        lines += [
            "",
            f"Batched / sequential: {ratios['meta_episodes_per_min']:.2f}x meta-episodes/min, "
            f"{ratios['tokens_per_s']:.2f}x tokens/s.",
        ]
    return "\n".join(lines)
