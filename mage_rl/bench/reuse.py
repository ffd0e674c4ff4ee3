"""Rollout time with and without prefix reuse (the engine's KV cache kept across calls).

In the conversation layout every call of a meta-episode is the previous call's prompt
and sampled response followed by a few new tokens, so the engine's prefix cache
(:mod:`mage_rl.policy.prefix_cache`) can skip the prefill of everything but those new
tokens. What it measures:

1. Load the model once and build the MAGE graph and ``meta_episodes`` task instances as
   :func:`~mage_rl.bench.rollout.bench_rollout` does, in the chosen layout.
2. Play them all at once through a batched
   :class:`~mage_rl.policy.engine.LocalEngine` without prefix reuse
   (``prefix_cache_mb=0``) and with it, alternating for ``rounds`` rounds; every call
   samples with the same seed, so both play the same games (up to rare last-bit
   differences that a reused prefix can make).
3. Report per setting the fastest round's wall time, meta-episodes per minute, LLM
   calls, prompt tokens prefilled and reused, and the engine's compute seconds; then
   the ratio of wall times.

The re-rendered layout (``layout="rerendered"``) shares only what the prompts of a
meta-episode have in common at their start (system prompt and rules), so it shows what
reuse gives without the conversation's growing prefix.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from mage_rl.bench.rollout import POPULATIONS, _run_mode, rollout_setup

if TYPE_CHECKING:
    from mage_rl.policy.models import DType

logger = logging.getLogger(__name__)

SETTINGS = ("without_reuse", "with_reuse")


def bench_reuse(
    model: str = "smollm2",
    meta_episodes: int = 16,
    env: str = "kuhn_poker",
    episodes: int = 3,
    max_tokens: int = 32,
    dtype: DType = "auto",
    seed: int = 0,
    rounds: int = 1,
    layout: str = "conversation",
    prefix_cache_mb: float = 1024,
) -> dict[str, Any]:
    """Time concurrent meta-episodes without and with prefix reuse.

    Args:
        model: Model spec for :func:`~mage_rl.policy.models.load_model`.
        meta_episodes: Meta-episodes played at once (the engine's ``max_batch_size``).
        env: ``kuhn_poker``, ``tic_tac_toe`` or ``sokoban``.
        episodes: K, episodes per meta-episode (all are played).
        max_tokens: Response limit of play turns (reflect turns get twice as many).
        dtype: Model dtype: ``auto``, ``bf16`` or ``fp32``.
        seed: Base seed of the task instances and the sampler seed of every call.
        rounds: Times each setting runs, alternating; each reports its fastest round.
        layout: ``conversation`` (the claim) or ``rerendered``.
        prefix_cache_mb: The prefix cache of the reusing engine (greater than 0).

    Returns:
        ``{"config": {...}, "settings": {"without_reuse": {...}, "with_reuse": {...}},
        "ratios": {"wall_s": without / with}}``; each setting has the measurements of
        :func:`~mage_rl.bench.rollout.bench_rollout`'s modes (``wall_s``,
        ``prefilled_tokens``, ``reused_tokens``, ``model_s``, ...) and ``round_wall_s``.

    Raises:
        ValueError: On an unknown environment or layout, ``meta_episodes`` or
            ``rounds`` below 1, or ``prefix_cache_mb`` not above 0.
    """
    import torch

    from mage_rl.policy.models import resolve_dtype

    if env not in POPULATIONS:
        raise ValueError(f"env={env!r} is not benchmarked; use one of {sorted(POPULATIONS)}")
    if layout not in ("conversation", "rerendered"):
        raise ValueError(f"layout={layout!r}: use conversation or rerendered")
    if meta_episodes < 1 or rounds < 1 or prefix_cache_mb <= 0:
        raise ValueError(
            f"meta_episodes={meta_episodes}, rounds={rounds}, prefix_cache_mb="
            f"{prefix_cache_mb}: give meta_episodes and rounds >= 1 and prefix_cache_mb > 0"
        )
    cfg, lm, tokenizer, graph, tasks = rollout_setup(
        model, meta_episodes, env, episodes, max_tokens, dtype, seed, layout
    )
    sizes = {"without_reuse": 0.0, "with_reuse": prefix_cache_mb}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for _ in range(rounds):
        for name in SETTINGS:
            logger.info("bench reuse: %s layout, %s", layout, name)
            run = _run_mode(cfg, "batched", lm, tokenizer, graph, tasks, seed, None, sizes[name])
            runs[name].append(run)
    settings = {}
    for name, done in runs.items():
        fastest = min(done, key=lambda r: r["wall_s"])
        settings[name] = {**fastest, "round_wall_s": [r["wall_s"] for r in done]}
    return {
        "config": {
            "model": model,
            "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
            "env": env,
            "layout": layout,
            "meta_episodes": meta_episodes,
            "episodes": episodes,
            "max_tokens": max_tokens,
            "seed": seed,
            "rounds": rounds,
            "prefix_cache_mb": prefix_cache_mb,
            "torch_threads": torch.get_num_threads(),
        },
        "settings": settings,
        "ratios": {
            "wall_s": settings["without_reuse"]["wall_s"]
            / max(settings["with_reuse"]["wall_s"], 1e-12)
        },
    }


def format_reuse_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_reuse`'s result, one row per setting."""
    cfg = result["config"]
    lines = [
        f"Prefix reuse: {cfg['meta_episodes']} concurrent {cfg['env']} meta-episodes "
        f"(K={cfg['episodes']}, max_tokens={cfg['max_tokens']}), {cfg['layout']} layout, "
        f"model {cfg['model']} ({cfg['dtype']}), {cfg['torch_threads']} torch threads, "
        f"seed {cfg['seed']}, fastest of {cfg['rounds']} round(s)",
        "",
        "| setting | wall s | meta-episodes/min | LLM calls | tokens | prompt tokens "
        "prefilled | reused | model s | CPU cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in result["settings"].items():
        lines.append(
            f"| {name.replace('_', ' ')} | {m['wall_s']:.1f} | {m['meta_episodes_per_min']:.2f} "
            f"| {m['llm_calls']} | {m['generated_tokens']} | {m['prefilled_tokens']} "
            f"| {m['reused_tokens']} | {m['model_s']:.1f} | {m['cpu_cores']:.2f} |"
        )
    lines += ["", f"Without / with reuse: {result['ratios']['wall_s']:.2f}x wall time."]
    return "\n".join(lines)
