"""A training run repeats bit for bit when the learner recomputes the old log-probs.

The engine's recorded log-probs depend, in their last bits, on which requests shared a
decoding batch; with `train.recompute_old_logprobs: always` the learner's own forward
pass (fixed micro-batches) supplies them, and the rollouts' samples come from seeds per
meta-episode, so how the meta-episodes were scheduled cannot change the run.
"""

from __future__ import annotations

import json
from pathlib import Path

from mage_rl.cli import main

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_adaptation_tiny.yaml"


def _losses(run: Path, concurrency: int, max_batch: int) -> list[dict]:
    code = main(
        [
            "train",
            str(CONFIG),
            "--set",
            "train.iterations=3",
            "--set",
            "rollout.tasks=4",
            "--set",
            "rollout.group_size=4",
            "--set",
            f"rollout.concurrency={concurrency}",
            "--set",
            f"policy.max_batch_size={max_batch}",
            "--set",
            "train.recompute_old_logprobs=always",
            "--run-dir",
            str(run),
            "--no-progress",
        ]
    )
    assert code == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keep = ("losses/loss", "losses/pg_loss", "losses/entropy", "losses/grad_norm")
    return [{k: x[k] for k in keep} for x in lines if "losses/loss" in x]


def test_two_runs_with_other_batching_have_equal_losses(tmp_path) -> None:
    first = _losses(tmp_path / "a", concurrency=16, max_batch=64)
    second = _losses(tmp_path / "b", concurrency=3, max_batch=2)
    assert len(first) == 3
    assert first == second
