"""Learner throughput: PPO updates per forward-pass dtype (bf16 autocast versus fp32).

What it measures, per dtype:

1. Load a fresh copy of the model and wrap it in a
   :class:`~mage_rl.rl.learner.Learner` whose forward pass runs in that dtype (master
   weights and AdamW stay float32 in both cases). The optimization settings follow
   ``configs/kuhn_smollm2.yaml``: a KL term to a reference copy (one extra no-grad
   forward pass per micro-batch), the entropy bonus, one optimizer step per update.
2. Build synthetic samples: random token ids of realistic lengths (a Kuhn play prompt of
   SmolLM2 is about 300 tokens, a response up to 32-64), random advantages, and
   old log-probs computed by the learner itself, so the PPO ratio starts at 1 and the
   update does the same work as on fresh rollouts. Every dtype trains on the same ids.
3. Run one warm-up update (first-call kernel set-up, optimizer state allocation), then
   ``repeats`` timed updates; report prompt-plus-response tokens through the learner per
   second in the fastest of them (other processes can only add time, so on a shared
   machine the fastest update is the best estimate of the machine's own speed).

The ratio bf16 / fp32 of tokens per second is the claim. bf16 only pays off on CPUs with
native bf16 instructions (``avx512_bf16``/``amx_bf16``); elsewhere it is emulated.

``variants`` compares other learner settings the same way: each is
``DTYPE[:MICRO_BATCH_TOKENS][:RESCORE]`` (say ``fp32:1024`` or ``bf16:1024:fused``), and
every variant after the first gets its ratio to the first. ``RESCORE`` is how the old
log-probs are had when sampler and learner differ in precision (``mage train`` rescores
then): ``recorded`` (the default: taken as they are), ``before`` (one no-grad pass over
the batch, then the update) or ``fused`` (``Learner.update(old_logprobs="rescored")``: the update's
own forward pass gives them). ``prompt_spread`` draws each
prompt's length from ``prompt_len +- prompt_spread``, so that micro-batches carry
padding as real batches do.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mage_rl.policy.models import DType

logger = logging.getLogger(__name__)

DTYPES = ("auto", "bf16", "fp32")
RESCORE = ("recorded", "before", "fused")


def bench_learner(
    model: str = "smollm2",
    dtypes: Sequence[DType] = ("bf16", "fp32"),
    samples: int = 16,
    prompt_len: int = 300,
    response_len: int = 40,
    seed: int = 0,
    repeats: int = 2,
    kl_coef: float = 0.1,
    micro_batch_tokens: int = 8192,
    variants: Sequence[str] | None = None,
    prompt_spread: int = 0,
) -> dict[str, Any]:
    """Time :meth:`~mage_rl.rl.learner.Learner.update` on synthetic samples per dtype.

    Args:
        model: Model spec for :func:`~mage_rl.policy.models.load_model`.
        dtypes: Forward-pass dtypes to compare (``bf16``, ``fp32``, ``auto``), in order.
        samples: Samples per update (one mini-batch, so one optimizer step).
        prompt_len: Prompt tokens per sample.
        response_len: Response tokens per sample (the trained ones).
        seed: Seed of the synthetic ids and advantages and of the learner's shuffling.
        repeats: Timed updates per dtype, after one untimed warm-up update.
        kl_coef: KL weight; above 0 the learner keeps a reference copy and runs one more
            forward pass per micro-batch (training configs use 0.1).
        micro_batch_tokens: Padded tokens per forward pass (training config: 8192).
        variants: Learner settings to compare instead of ``dtypes``:
            ``DTYPE[:MICRO_BATCH_TOKENS][:RESCORE]`` each (without the second part:
            the ``micro_batch_tokens`` argument; without the third: ``recorded``).
        prompt_spread: Prompt lengths are drawn from ``prompt_len +- prompt_spread``.

    Returns:
        ``{"config": {...}, "dtypes": {variant: {...}}, "ratios": {...}}``. Each entry has
        ``autocast`` (the resolved autocast dtype or ``float32``), ``tokens_per_update``,
        ``warmup_s``, ``update_s`` (the fastest timed update), ``tokens_per_s``,
        ``repeat_s`` (every timed update), ``cpu_cores`` (process CPU time over wall time
        of the timed updates; well under ``torch_threads`` hints at competing processes),
        ``approx_kl`` and ``clip_frac`` of the warm-up update (about 0: the ratio
        starts at 1). ``ratios["bf16/fp32"]`` of ``tokens_per_s`` is there when both ran;
        with ``variants``, ``ratios["V/FIRST"]`` for every variant after the first.

    Raises:
        ValueError: On an unknown dtype, a malformed variant or a non-positive size.
    """
    import torch

    from mage_rl.policy.models import load_model
    from mage_rl.rl.learner import Learner, LearnerConfig

    names = tuple(variants) if variants else tuple(dtypes)
    settings = {name: _variant(name, micro_batch_tokens) for name in names}
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{list(names)}: give distinct learner settings to compare")
    if not 0 <= prompt_spread < prompt_len:
        raise ValueError(f"prompt_spread must be in [0, prompt_len), got {prompt_spread}")
    for name, value in (
        ("samples", samples),
        ("prompt_len", prompt_len),
        ("response_len", response_len),
        ("repeats", repeats),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")

    ids: list[tuple[list[int], list[int], float]] | None = None
    results: dict[str, dict[str, Any]] = {}
    for dtype, (precision, micro, rescore) in settings.items():
        # A fresh fp32 copy per variant: the learner trains in place and keeps fp32 master
        # weights anyway, so every variant starts from the same weights.
        lm, _ = load_model(model, dtype="fp32")
        if ids is None:
            ids = _synthetic_ids(
                lm.config.vocab_size, samples, prompt_len, response_len, seed, prompt_spread
            )
        learner = Learner(
            lm,
            LearnerConfig(
                lr=1e-6,
                kl_coef=kl_coef,
                mini_batch_size=samples,
                micro_batch_tokens=micro,
                dtype=precision,
                seed=seed,
            ),
        )
        batch = on_policy_batch(learner, ids)
        tokens = sum(s.length for s in batch)
        logger.info("bench learner %s: warm-up update of %d tokens", dtype, tokens)
        cuda = learner.device.type == "cuda"
        timed = time_updates(
            learner, batch, repeats, torch.cuda.synchronize if cuda else None, rescore
        )
        autocast = learner.autocast_dtype
        results[dtype] = {
            "autocast": str(autocast or torch.float32).removeprefix("torch."),
            "tokens_per_update": tokens,
            **timed,
            "tokens_per_s": tokens / timed["update_s"],
        }
        logger.info("bench learner %s: %.1f tokens/s", dtype, results[dtype]["tokens_per_s"])
        del learner, lm, batch
        gc.collect()

    ratios = {}
    if "bf16" in results and "fp32" in results:
        ratios["bf16/fp32"] = results["bf16"]["tokens_per_s"] / results["fp32"]["tokens_per_s"]
    if variants:
        first = names[0]
        for name in names[1:]:
            ratios[f"{name}/{first}"] = (
                results[name]["tokens_per_s"] / results[first]["tokens_per_s"]
            )
    return {
        "config": {
            "model": model,
            "samples": samples,
            "prompt_len": prompt_len,
            "response_len": response_len,
            "seed": seed,
            "repeats": repeats,
            "kl_coef": kl_coef,
            "micro_batch_tokens": micro_batch_tokens,
            "prompt_spread": prompt_spread,
            "torch_threads": torch.get_num_threads(),
        },
        "dtypes": results,
        "ratios": ratios,
    }


def on_policy_batch(learner: Any, ids: list[tuple[list[int], list[int], float]]) -> list[Any]:
    """:class:`~mage_rl.rl.batching.Sample` objects of ``ids`` whose old log-probs are the
    learner's own, so the PPO ratio starts at 1 and an update does the work of one on
    fresh rollouts."""
    from mage_rl.rl.batching import Sample

    unscored = [Sample(p, r, [0.0] * len(r), a) for p, r, a in ids]
    old = learner.compute_logprobs(unscored)
    return [Sample(p, r, lp, a) for (p, r, a), lp in zip(ids, old, strict=True)]


def time_updates(
    learner: Any,
    batch: Sequence[Any],
    repeats: int,
    sync: Callable[[], None] | None = None,
    rescore: str = "recorded",
) -> dict[str, Any]:
    """One warm-up :meth:`~mage_rl.rl.learner.Learner.update`, then ``repeats`` timed ones.

    ``sync`` (say ``torch.cuda.synchronize``) runs before each clock reading, so queued
    GPU work is counted in the update that queued it. ``rescore``: see the module notes.

    Returns:
        ``warmup_s``, ``update_s`` (the fastest timed update), ``repeat_s`` (all of them),
        ``cpu_cores`` (process CPU time over wall time of the timed updates), and
        ``approx_kl`` and ``clip_frac`` of the warm-up update.
    """
    sync = sync or (lambda: None)

    def update() -> dict[str, float]:
        if rescore == "fused":
            return learner.update(batch, old_logprobs="rescored")
        if rescore == "before":
            fresh = learner.compute_logprobs(batch)
            rescored = [s.with_old_logprobs(lp) for s, lp in zip(batch, fresh, strict=True)]
            return learner.update(rescored)
        return learner.update(batch)

    sync()
    start = time.perf_counter()
    warm = update()
    sync()
    warmup_s = time.perf_counter() - start
    timings = []
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for _ in range(repeats):
        start = time.perf_counter()
        update()
        sync()
        timings.append(time.perf_counter() - start)
    cpu_cores = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    return {
        "warmup_s": warmup_s,
        "update_s": min(timings),
        "repeat_s": timings,
        "cpu_cores": cpu_cores,
        "approx_kl": warm["approx_kl"],
        "clip_frac": warm["clip_frac"],
    }


def _variant(name: str, micro_batch_tokens: int) -> tuple[Any, int, str]:
    """``DTYPE[:MICRO_BATCH_TOKENS][:RESCORE]`` -> (dtype, micro-batch tokens, rescore)."""
    parts = name.split(":")
    try:
        if parts[0] not in DTYPES or len(parts) > 3:
            raise ValueError
        micro = int(parts[1]) if len(parts) > 1 and parts[1] else micro_batch_tokens
        rescore = parts[2] if len(parts) > 2 else "recorded"
        if rescore not in RESCORE:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"learner setting {name!r}: write DTYPE[:MICRO_BATCH_TOKENS][:RESCORE] with "
            f"DTYPE among {list(DTYPES)} and RESCORE among {list(RESCORE)}, say fp32:1024 "
            "or bf16:1024:fused"
        ) from None
    return parts[0], micro, rescore


def _synthetic_ids(
    vocab_size: int,
    samples: int,
    prompt_len: int,
    response_len: int,
    seed: int,
    prompt_spread: int = 0,
) -> list[tuple[list[int], list[int], float]]:
    """``(prompt_ids, response_ids, advantage)`` per sample: uniform ids, normal advantages,
    prompt lengths uniform in ``prompt_len +- prompt_spread``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab_size, (samples, prompt_len + prompt_spread), generator=gen)
    responses = torch.randint(0, vocab_size, (samples, response_len), generator=gen)
    advantages = torch.randn(samples, generator=gen)
    lengths = torch.randint(
        prompt_len - prompt_spread, prompt_len + prompt_spread + 1, (samples,), generator=gen
    )
    if not prompt_spread:
        lengths = torch.full((samples,), prompt_len)
    return [
        (prompts[i, : int(lengths[i])].tolist(), responses[i].tolist(), float(advantages[i]))
        for i in range(samples)
    ]


def format_learner_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_learner`'s result, one row per variant, then ratios."""
    cfg = result["config"]
    spread = f" +- {cfg['prompt_spread']}" if cfg.get("prompt_spread") else ""
    lines = [
        f"Learner: model {cfg['model']}, {cfg['samples']} samples of {cfg['prompt_len']}"
        f"{spread} + {cfg['response_len']} tokens per update, kl_coef {cfg['kl_coef']}, "
        f"fastest of {cfg['repeats']} timed updates after a warm-up, "
        f"{cfg['torch_threads']} torch threads",
        "",
        "| dtype[:micro-batch tokens] | autocast | tokens/update | warm-up s | s/update "
        "| tokens/s | approx KL "
        "| clip frac | CPU cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, d in result["dtypes"].items():
        lines.append(
            f"| {dtype} | {d['autocast']} | {d['tokens_per_update']} | {d['warmup_s']:.1f} "
            f"| {d['update_s']:.1f} | {d['tokens_per_s']:.0f} | {d['approx_kl']:.1e} "
            f"| {d['clip_frac']:.3f} | {d['cpu_cores']:.2f} |"
        )
    ratios = result.get("ratios") or {}
    if "bf16/fp32" in ratios:
        lines += ["", f"bf16 / fp32: {ratios['bf16/fp32']:.2f}x tokens/s."]
    others = [(k, v) for k, v in ratios.items() if k != "bf16/fp32"]
    if others:
        lines.append("")
        lines += [f"{k.replace('/', ' / ')}: {v:.2f}x tokens/s." for k, v in others]
    return "\n".join(lines)
