"""Training metrics to TensorBoard event files and a ``metrics.jsonl``.

Names use fixed namespaces (``charts/``, ``losses/``, ``perf/``, ``eval/``) so curves
from different runs line up. Each JSONL line is one iteration's flat mapping, flushed
right away so a crash loses nothing already logged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def flatten_summary(summary: dict[str, Any], prefix: str) -> dict[str, float]:
    """``summarize_records`` output -> flat ``{prefix/metric@k: value}``."""
    out: dict[str, float] = {}

    def put(block: dict[str, Any], where: str) -> None:
        for name in ("success@k", "draw@k", "ev@k"):
            for k, value in enumerate(block.get(name, []), start=1):
                if value is not None:
                    out[f"{where}/{name[:-2]}@{k}"] = float(value)
        if "final_reward" in block:
            out[f"{where}/final_reward"] = float(block["final_reward"])

    put(summary, prefix)
    for opponent, block in summary.get("by_opponent", {}).items():
        put(block, f"{prefix}/opponent/{opponent.split(':', 1)[-1]}")
    for seat, block in summary.get("by_seat", {}).items():
        put(block, f"{prefix}/seat/{seat}")
    return out


class MetricsLogger:
    """Writes scalars to TensorBoard (``tb/``) and ``metrics.jsonl`` in a run folder."""

    def __init__(self, run_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))
        self._jsonl = (self.run_dir / "metrics.jsonl").open("a")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in scalars.items() if v is not None and math.isfinite(v)}
        for key, value in clean.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()
        self._jsonl.write(json.dumps({"iteration": step, **clean}) + "\n")
        self._jsonl.flush()

    def close(self) -> None:
        self.writer.close()
        self._jsonl.close()
