"""``mage serve --engine vllm`` answering the ``openai`` client, and ``mage train`` with
``policy.engine: vllm``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mage_rl.cli import main
from mage_rl.serve import free_port

from .conftest import VLLM

pytestmark = VLLM

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_smollm2.yaml"
REPO = Path(__file__).parents[2]


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"mage serve exited with {process.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise AssertionError(f"{url} was not healthy after {timeout}s")


def test_mage_serve_vllm_answers_the_openai_client_and_stops_on_ctrl_c(tmp_path) -> None:
    openai = pytest.importorskip("openai")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MAGE_API_KEY": "k3y"}
    cmd = [sys.executable, "-c", "from mage_rl.cli import main; raise SystemExit(main())",
           "serve", "smollm2", "--engine", "vllm", "--port", str(port), "--dtype", "fp32",
           "--vllm-arg=--enforce-eager"]  # fmt: skip
    process = subprocess.Popen(cmd, env=env, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(root, process)
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="k3y", max_retries=0)
        reply = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
            logprobs=True, extra_body={"return_token_ids": True}, seed=2,
        )  # fmt: skip
        choice = reply.choices[0].model_dump()
        assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) >= 1
        assert reply.model_dump()["prompt_token_ids"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{root}/v1", api_key="wrong", max_retries=0).models.list()
    finally:
        # Ctrl-C reaches mage alone (its own session): it must stop vLLM itself.
        os.kill(process.pid, signal.SIGINT)
        code = process.wait(120)
    assert code == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{root}/health", timeout=5)


def test_two_iterations_of_mage_train_sample_through_vllm(tmp_path) -> None:
    run = tmp_path / "kuhn_vllm"
    overrides = ["policy.engine=vllm", "policy.dtype=fp32", "policy.constrain_actions=false",
                 "rollout.tasks=2",
                 "rollout.group_size=2", "rollout.concurrency=4", "eval.tasks=0",
                 "train.iterations=2", "learner.dtype=fp32",
                 # Small micro-batches: a 49k-token vocabulary's logits over 8192 tokens
                 # take gigabytes, and the vLLM server shares the machine's memory.
                 "learner.micro_batch_tokens=1024"]  # fmt: skip
    args = ["train", str(CONFIG), "--run-dir", str(run), "--no-progress"]
    assert main(args + [a for o in overrides for a in ("--set", o)]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [1, 2]
    assert (run / "checkpoints" / "iter_000002" / "model" / "config.json").exists()
    config = (run / "config.yaml").read_text()
    assert "engine: vllm" in config
