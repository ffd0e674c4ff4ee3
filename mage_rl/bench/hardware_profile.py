"""Where the hardware benchmark's time goes: profiles of an update and of decoding, and
the plainest decode loop of a model, which the engine's steps are compared with.

Used by :mod:`mage_rl.bench.hardware` (``mage bench hardware --profile``); the figures
these gave on a CPU and on an H100 are in docs/cluster.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def profile_update(learner: Any, batch: Any, sync: Callable[[], None], top: int = 15) -> dict:
    """Where one learner update spends its time: the ``top`` operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = learner.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        learner.update(batch)
        sync()
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    keys = ("self_device_time_total", "self_cuda_time_total") if cuda else ()
    key = next((k for k in keys if any(getattr(e, k, 0) for e in averages)), "self_cpu_time_total")
    ops, total = _top_ops(averages, key, top)
    for op in ops:
        op["share"] = op["self_s"] / total
    return {"sorted_by": key, "wall_s": wall, "self_total_s": total, "ops": ops}


def _top_ops(averages: Any, key: str, top: int) -> tuple[list[dict[str, Any]], float]:
    """The ``top`` operators of a profile by ``key`` (a self time), and that time's total."""
    events = [e for e in averages if getattr(e, key, 0) > 0]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events) / 1e6
    ops = [{"op": e.key, "self_s": getattr(e, key) / 1e6, "calls": e.count} for e in events[:top]]
    return ops, total


def bare_decode_step(
    model: Any, prompts: list[list[int]], n: int, sync: Callable[[], None]
) -> float:
    """Seconds per step of the plainest decode loop of the same model and batch.

    One prefill of the (equal-length) prompts, then ``n`` forward passes of one token per
    row with the key/value cache, the next token the argmax on the device: no attention
    mask, no sampling, no token copied to the host. What the engine adds per step is its step
    time over this one.
    """
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor(prompts, dtype=torch.long, device=device)  # (B, T)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1)
        position = torch.full((len(prompts), 1), ids.shape[1], device=device)
        times = []
        for _ in range(n):
            sync()
            start = time.perf_counter()
            out = model(input_ids=token[:, None], position_ids=position,
                        past_key_values=cache, use_cache=True)  # fmt: skip
            token, position = out.logits[:, -1].argmax(-1), position + 1
            sync()
            times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]  # the median: the first steps pay for kernel set-up


def profile_decode(
    decode: Callable[[], Any], thread: str, top: int = 15, every_s: float = 0.002
) -> dict:
    """Where the engine's decode spends its host time, two ways, during one ``decode()``.

    ``ops``: the operators with the most self CPU time, on every thread
    (``torch.profiler``, ``profile_all_threads``). ``python``: a sampling profile of the
    engine's worker thread, every ``every_s`` seconds from another thread; each sample
    of the thread named ``thread`` counts its innermost frame of mage_rl, transformers or
    torch code (``file:function``); ``share`` is the share of samples in each.
    """
    import collections
    import sys
    import threading

    from torch.profiler import ProfilerActivity, profile

    target = next((t.ident for t in threading.enumerate() if t.name == thread), None)
    samples: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def sample() -> None:
        while not done.wait(every_s):
            frame = sys._current_frames().get(target) if target else None
            where = "idle"
            while frame is not None:
                name = frame.f_code.co_filename
                if any(part in name for part in ("mage_rl", "transformers", "torch")):
                    short = "/".join(name.split("/")[-2:])
                    where = f"{short}:{frame.f_code.co_name}"
                    break
                frame = frame.f_back
            samples[where] += 1

    config = None
    try:
        from torch._C._profiler import _ExperimentalConfig

        config = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError):  # an older torch: the calling thread only
        pass
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with profile(activities=[ProfilerActivity.CPU], experimental_config=config) as prof:
            start = time.perf_counter()
            decode()
            wall = time.perf_counter() - start
    finally:
        done.set()
        sampler.join()
    ops, total = _top_ops(prof.key_averages(), "self_cpu_time_total", top)
    for op in ops:
        op["share_of_wall"] = op["self_s"] / wall
    count = sum(samples.values()) or 1
    python = [{"where": k, "share": v / count} for k, v in samples.most_common(top)]
    return {"wall_s": wall, "ops_self_total_s": total, "ops": ops, "python": python,
            "all_threads": config is not None, "engine_thread_found": target is not None}  # fmt: skip
