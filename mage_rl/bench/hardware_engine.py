"""The engine phase of ``mage bench hardware``: decode steps against the hardware.

For each batch size B, B requests of ``prompt_len`` random tokens arrive together and
are prefilled in one pass (prefix reuse off); decoding ``N`` tokens (EOS ignored) minus
decoding 1 token is the time of ``N - 1`` decode steps. This runs once per way of
running a decode step (``static_decode``, :mod:`mage_rl.policy.static_decode`): over a
cache that grows a column a step (``off``), over preallocated buffers (``eager``), and
over those buffers replayed as CUDA graphs (``graphs``), back to back on the same
weights and prompts. The batch's headline figures are those of the engine's default for
the device (``auto``); each mode's step time is kept beside them, with ``graphs_speedup``
(``off`` over ``graphs``) when both ran. Beside them, the plainest decode loop of the
same model (:func:`~mage_rl.bench.hardware_profile.bare_decode_step`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from mage_rl.bench.hardware_profile import bare_decode_step, profile_decode
from mage_rl.policy.base import SamplingParams

logger = logging.getLogger(__name__)


def attention_flops(shape: dict[str, Any], context: float) -> float:
    """Forward FLOPs of one token's attention over ``context`` keys, all layers."""
    return 4.0 * shape["layers"] * shape["heads"] * shape["head_dim"] * context


def static_modes(requested: Sequence[str] | None, cuda: bool) -> list[str]:
    """The decode modes to time: ``requested``, or ``off`` and ``graphs`` on CUDA and
    ``off`` elsewhere; the engine's default for the device first when it is among them."""
    default = "graphs" if cuda else "off"  # what static_decode="auto" resolves to
    modes = list(requested) if requested else ([default, "off"] if cuda else [default])
    unknown = [m for m in modes if m not in ("off", "eager", "graphs")]
    if unknown or ("graphs" in modes and not cuda):
        raise ValueError(
            f"static decode modes {modes}: use off, eager, and graphs (on a CUDA device only)"
        )
    return list(dict.fromkeys([default, *modes] if default in modes else modes))


def engine_phase(
    model: Any, tokenizer: Any, shape: dict[str, Any], peak: dict[str, Any],
    sync: Callable[[], None], *, batch_sizes: Sequence[int], prompt_len: int,
    decode_tokens: int, rounds: int, seed: int, profile: bool = False,
    modes: Sequence[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Time decode steps at each batch size and mode; figures as in the module docstring."""
    import torch

    from mage_rl.policy.engine import LocalEngine

    first = next(model.parameters())
    device, value_bytes = first.device, first.element_size()
    cuda = device.type == "cuda"
    order = static_modes(modes, cuda)
    weight_bytes = (shape["body"] + shape["head"]) * value_bytes
    kv_per_key = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * value_bytes
    context = prompt_len + decode_tokens / 2
    flops_per_token = 2.0 * (shape["body"] + shape["head"]) + attention_flops(shape, context)
    gen = torch.Generator().manual_seed(seed + 1)

    async def run(engine: LocalEngine, prompts: list[list[int]], n: int) -> float:
        params, start = SamplingParams(max_tokens=n, temperature=1.0), time.perf_counter()
        calls = (engine.generate_from_ids(p, params, ignore_eos=True) for p in prompts)
        await asyncio.gather(*calls)
        sync()
        return time.perf_counter() - start

    batches: dict[str, Any] = {}
    for size in batch_sizes:
        prompts = torch.randint(0, shape["vocab"], (size, prompt_len), generator=gen).tolist()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        timed: dict[str, dict[str, Any]] = {}
        for mode in order:
            engine = LocalEngine(
                model, tokenizer, max_batch_size=size, batch_wait_ms=50, seed=seed,
                prefix_cache_mb=0, prefill_tokens=size * prompt_len, static_decode=mode,
            )  # fmt: skip
            with engine:
                asyncio.run(run(engine, prompts, 2))  # warm-up: thread, kernels, graph capture
                steps = []
                for _ in range(rounds):
                    one = asyncio.run(run(engine, prompts, 1))
                    full = asyncio.run(run(engine, prompts, decode_tokens))
                    steps.append((full - one) / (decode_tokens - 1))
                if profile and mode == order[0]:
                    # A short decode: on a host-bound GPU machine a step is ~100 ms.
                    short = functools.partial(
                        asyncio.run, run(engine, prompts, min(decode_tokens, 8))
                    )
                    traced = profile_decode(short, thread=f"mage-engine-{engine.name}")
            stats = engine.stats
            timed[mode] = {
                "step_s": max(min(steps), 1e-9), "steps_s": steps, "first_s": one,
                "graph_captures": stats.graph_captures, "graph_failures": stats.graph_failures,
            }  # fmt: skip
        step_s, one = timed[order[0]]["step_s"], timed[order[0]]["first_s"]
        bare_s = bare_decode_step(model, prompts, min(decode_tokens, 16), sync)
        kv_bytes = size * context * kv_per_key
        bandwidth = peak["copy_bytes_per_s"]
        entry = {
            "static_decode": order[0], "prefill_and_first_token_s": one, "step_s": step_s,
            "steps_s": timed[order[0]]["steps_s"],
            "tokens_per_s": size / step_s, "weight_bytes_per_step": weight_bytes,
            "kv_bytes_per_step": kv_bytes, "bandwidth_share": weight_bytes / step_s / bandwidth,
            "bandwidth_share_kv": (weight_bytes + kv_bytes) / step_s / bandwidth,
            "compute_share": size * flops_per_token / step_s / peak["matmul_flops_per_s"],
            "bare_step_s": bare_s, "bare_bandwidth_share": weight_bytes / bare_s / bandwidth,
            "engine_over_bare": step_s / bare_s, "modes": timed,
        }  # fmt: skip
        if "off" in timed and "graphs" in timed:
            entry["graphs_speedup"] = timed["off"]["step_s"] / timed["graphs"]["step_s"]
        if profile:
            entry["profile"] = traced
        if cuda:
            entry["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        batches[str(size)] = entry
        logger.info(
            "bench hardware: decode at batch %d: %s", size,
            ", ".join(f"{m} {size / t['step_s']:.1f} tokens/s" for m, t in timed.items()),
        )  # fmt: skip
    dtype = str(first.dtype).removeprefix("torch.")
    return {"dtype": dtype, "context": context, "flops_per_token": flops_per_token,
            "modes": order, "batches": batches}  # fmt: skip
