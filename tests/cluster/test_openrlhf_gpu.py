"""End to end on GPUs: `mage train --backend openrlhf` for one iteration (skipped on CPUs).

Set MAGE_GPU_MODEL to a small HF model directory (e.g. Qwen3-0.6B) on a machine with
CUDA GPUs, vLLM, DeepSpeed and OpenRLHF (`pip install 'mage-rl[cluster]'`), then run
`pytest -m gpu tests/cluster`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from mage_rl.cli import main

PAPER = Path(__file__).parents[2] / "configs" / "paper" / "kuhn_qwen3_4b_openrlhf.yaml"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA GPUs")
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
@pytest.mark.skipif("MAGE_GPU_MODEL" not in os.environ, reason="set MAGE_GPU_MODEL")
def test_openrlhf_backend_trains_one_iteration(tmp_path: Path) -> None:  # pragma: no cover
    gpus = torch.cuda.device_count()
    run = tmp_path / "run"
    code = main(["train", str(PAPER), "--backend", "openrlhf", "--run-dir", str(run),
                 "--no-progress",
                 "--set", f"policy.model={os.environ['MAGE_GPU_MODEL']}",
                 "--set", "train.ray_address=null", "--set", "train.iterations=1",
                 "--set", "rollout.tasks=2", "--set", "rollout.group_size=2",
                 "--set", "policy.max_tokens=64", "--set", "eval.tasks=2",
                 "--set", "learner.mini_batch_size=8",
                 "--set", f"openrlhf.actor_gpus_per_node={gpus}",
                 "--set", f"openrlhf.ref_gpus_per_node={gpus}",
                 "--set", f"openrlhf.vllm_engines={gpus}",
                 "--set", "openrlhf.micro_train_batch_size=1",
                 "--set", "openrlhf.max_len=4096"])  # fmt: skip
    assert code == 0
    line = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "losses/loss" in line and "charts/success@3" in line
    assert (run / "checkpoints" / "iter_000001" / "model" / "config.json").exists()
