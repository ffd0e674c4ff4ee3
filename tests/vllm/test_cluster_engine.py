"""The cluster path's :class:`VLLMEnginePolicy` over a real vLLM engine on the CPU.

OpenRLHF (and Ray) are not in vLLM's CPU environment, so the engine is vLLM's own
``AsyncLLM`` in a child process of that environment, wrapped in the ``generate``
contract of OpenRLHF's engine actors (``_cluster_engine.py``). What is checked here is
what the cluster path relies on: the ids, text and processed log-probs it records.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tokenization import render_prompt
from mage_rl.policy.vllm_engine import CPU_KV_CACHE_GIB, find_vllm_python, vllm_model_dir

from .conftest import VLLM
from .test_engine import FP32_ATOL

pytestmark = VLLM

SCRIPT = Path(__file__).with_name("_cluster_engine.py")
REPO = Path(__file__).parents[2]
REQUESTS = [
    {"messages": [{"role": "user", "content": "Your card is K. Do you BET or PASS?"}],
     "temperature": 1.0, "seed": 1},
    {"messages": [{"role": "system", "content": "You play Kuhn Poker."},
                  {"role": "user", "content": "Card: J."}], "temperature": 0.7, "seed": 2},
    {"messages": [{"role": "user", "content": "Name a card."}], "temperature": 1.0, "seed": 3},
]  # fmt: skip


def test_vllm_engine_policy_records_what_the_learner_scores(tmp_path, smollm2_fp32) -> None:
    model, tokenizer = smollm2_fp32
    asked, out = tmp_path / "requests.json", tmp_path / "generations.json"
    asked.write_text(json.dumps(REQUESTS))
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB)}
    python = find_vllm_python()
    assert python is not None
    subprocess.run([python, str(SCRIPT), vllm_model_dir("smollm2"), str(asked), str(out)], env=env,
                   check=True, timeout=1200)  # fmt: skip
    rows = json.loads(out.read_text())
    assert len(rows) == len(REQUESTS)
    for request, row in zip(REQUESTS, rows, strict=True):
        assert row["prompt_ids"] == render_prompt(tokenizer, request["messages"])
        assert len(row["response_ids"]) == len(row["logprobs"]) >= 1
        assert tokenizer.decode(row["response_ids"], skip_special_tokens=True) == row["text"]
        with torch.no_grad():
            forced = teacher_forced_logprobs(
                model, row["prompt_ids"], row["response_ids"], temperature=row["temperature"]
            )
        assert torch.allclose(forced, torch.tensor(row["logprobs"]), atol=FP32_ATOL)
