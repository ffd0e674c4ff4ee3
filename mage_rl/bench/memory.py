"""Where a training config's memory goes, iteration by iteration.

Builds the config's trainer in a scratch folder (model, learner and engine, as
``mage train`` does), then plays ``iterations`` iterations of rollouts and updates. After
set-up and after each phase it records the process's resident memory (RSS), what the C
allocator holds in use and free (glibc's ``mallinfo2``: live allocations, freed memory it
kept, and large blocks it mapped on their own), and the highest RSS sampled every 20 ms
during the phase. With ``release`` (what ``mage train`` does) the allocator's free pages
are handed back after each phase (:mod:`mage_rl.memory`); without it they stay, as they
did before.

What it tells apart: memory in use that grows from one iteration to the next (a cache
without a bound, or one filled by ever new shapes), memory the allocator keeps free, and
the peak of the update above the memory in use between updates.
"""

from __future__ import annotations

import ctypes
import gc
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from mage_rl.api import load_config
from mage_rl.memory import release_free_memory
from mage_rl.rl.phases import resident_mb


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _allocator() -> dict[str, float] | None:
    """glibc's view of the heap in MiB, or ``None`` elsewhere."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return {
        "in_use_mb": round(info.uordblks / 2**20, 1),
        "free_kept_mb": round(info.fordblks / 2**20, 1),
        "mapped_mb": round(info.hblkhd / 2**20, 1),
    }


class _Peak:
    """The highest RSS sampled every 20 ms since the last :meth:`take`."""

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            now = resident_mb() or 0.0
            with self._lock:  # not a read from before a take() written back after it
                self.value = max(self.value, now)

    def take(self) -> float:
        with self._lock:
            value, self.value = self.value, 0.0
        return round(value, 1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def bench_memory(
    config: str,
    sets: Sequence[str] = (),
    iterations: int = 4,
    release: bool = True,
    tree_pad: int | None = None,
) -> dict[str, Any]:
    """Measure the memory of ``iterations`` training iterations of ``config``.

    Args:
        config: A training config file (say ``configs/rps_smollm2.yaml``).
        sets: ``key=value`` overrides, as ``mage train --set``.
        iterations: Iterations of rollouts and updates to play.
        release: Hand the allocator's free pages back after each phase, as training does.
        tree_pad: Pad the learner's prefix trees to a multiple of this many nodes in this
            process instead of :data:`~mage_rl.rl.prefix_tree.TREE_PAD_MULTIPLE` (1: no
            padding, as before it was added).

    Returns:
        ``{"config": {...}, "rows": [...]}``: one row per point (set-up, then the rollouts
        and the update of each iteration) with ``seconds``, ``rss_mb``, ``peak_mb`` (the
        highest RSS during the phase) and glibc's ``in_use_mb``, ``free_kept_mb`` and
        ``mapped_mb`` (absent where the C library is not glibc).

    Raises:
        ValueError: ``iterations`` below 1.
    """
    import torch

    from mage_rl.rl import prefix_tree
    from mage_rl.rl.trainer import Trainer

    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if tree_pad is not None:
        if tree_pad < 1:
            raise ValueError(f"tree_pad must be >= 1, got {tree_pad}")
        prefix_tree.TREE_PAD_MULTIPLE = tree_pad
    cfg = load_config(config, [*sets, "eval.tasks=0", "eval.before=false"])
    rows: list[dict[str, Any]] = []
    peak = _Peak()

    def point(label: str, seconds: float) -> None:
        if release:
            release_free_memory()
        gc.collect()
        rows.append({"at": label, "seconds": round(seconds, 1), "rss_mb": round(resident_mb() or 0.0, 1),
                     "peak_mb": peak.take(), **(_allocator() or {})})  # fmt: skip

    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="mage-bench-memory-") as scratch:
            trainer = Trainer(cfg, scratch, progress=False)
            try:
                point("set-up", time.perf_counter() - start)
                for it in range(iterations):
                    t0 = time.perf_counter()
                    records = trainer.rollout(it)
                    point(f"iteration {it + 1}: rollouts", time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    trainer.learn(records)
                    point(f"iteration {it + 1}: update", time.perf_counter() - t0)
            finally:
                trainer.engine.close()
    finally:
        peak.stop()
    return {
        "config": {
            "config": config,
            "sets": list(sets),
            "iterations": iterations,
            "release": release,
            "model": cfg.policy.model,
            "lora": cfg.learner.lora,
            "tree_pad": prefix_tree.TREE_PAD_MULTIPLE,
            "torch_threads": torch.get_num_threads(),
        },  # fmt: skip
        "rows": rows,
    }


def format_memory_report(result: dict[str, Any]) -> str:
    """The rows as a markdown table."""
    c = result["config"]
    lines = [
        f"# Memory of {c['config']} ({c['model']}, {'LoRA' if c['lora'] else 'full fine-tuning'}; "
        f"free memory {'handed back' if c['release'] else 'kept'} after each phase; trees padded "
        f"to {c['tree_pad']} nodes)",
        "",
        "| after | seconds | RSS MB | peak during MB | in use MB | free kept MB | mapped MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['at']} | {r['seconds']:.1f} | {r['rss_mb']:.0f} | {r['peak_mb']:.0f} | "
            f"{r.get('in_use_mb', float('nan')):.0f} | {r.get('free_kept_mb', float('nan')):.0f} | "
            f"{r.get('mapped_mb', float('nan')):.0f} |"
        )
    return "\n".join(lines)
