"""Checkpoints of ``mage train`` are servable, LoRA ones included; the CLI and vLLM launch."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch

from mage_rl.cli import build_parser, main
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.models import load_model
from mage_rl.serve import create_app, resolve_model, serve_in_thread, vllm_available, vllm_command
from mage_rl.serve.launch import VLLM_HINT, serve_vllm

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "kuhn_tiny_lora"
    overrides = ["train.iterations=1", "rollout.group_size=2", "learner.lora=true", "learner.lora_r=4", "learner.kl_coef=0",
                 "rollout.tasks=1", "eval.tasks=0"]  # fmt: skip
    args = ["train", str(CONFIG), "--run-dir", str(run), "--no-progress"]
    assert main(args + [a for o in overrides for a in ("--set", o)]) == 0
    return run


def test_lora_checkpoint_holds_a_merged_servable_model(lora_run: Path) -> None:
    checkpoint = lora_run / "checkpoints" / "iter_000001"
    assert (checkpoint / "adapter" / "adapter_config.json").exists()
    assert (checkpoint / "model" / "config.json").exists()
    # The run folder, the checkpoint and its model/ all name the same model directory.
    for spec in (lora_run, checkpoint, checkpoint / "model"):
        assert resolve_model(str(spec)) == str(checkpoint / "model")
    model, tokenizer = load_model(resolve_model(str(lora_run)), dtype="fp32")
    initial, _ = load_model("tiny", dtype="fp32")
    trained = dict(model.named_parameters())
    changed = [n for n, p in initial.named_parameters() if not torch.equal(p, trained[n])]
    assert changed and all("proj" in n for n in changed)  # LoRA targets, merged in
    with (
        LocalEngine(model, tokenizer, name="trained") as engine,
        serve_in_thread(create_app(engine, "trained")) as url,
    ):
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(
                model="trained", messages=[{"role": "user", "content": "Your card is K."}],
                max_tokens=4,
            )  # fmt: skip
    assert reply.usage.completion_tokens >= 1


def test_lora_run_resumes_from_its_adapters(lora_run: Path) -> None:
    args = ["train", str(CONFIG), "--run-dir", str(lora_run), "--no-progress", "--resume"]
    overrides = ["train.iterations=2", "rollout.group_size=2", "learner.lora=true", "learner.lora_r=4", "learner.kl_coef=0",
                 "rollout.tasks=1", "eval.tasks=0"]  # fmt: skip
    assert main(args + [a for o in overrides for a in ("--set", o)]) == 0
    assert (lora_run / "checkpoints" / "iter_000002" / "model" / "config.json").exists()


def test_resolve_model_errors_say_what_to_do(tmp_path: Path) -> None:
    assert resolve_model("tiny") == "tiny"
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_model(str(tmp_path / "run"))
    old = tmp_path / "old" / "model"
    old.mkdir(parents=True)
    (old / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="LoRA adapters only"):
        resolve_model(str(tmp_path / "old"))


def test_serve_command_line() -> None:
    args = build_parser().parse_args(
        ["serve", "runs/kuhn", "--port", "9001", "--api-key", "k", "--engine", "vllm"]
    )
    assert (args.model, args.host, args.port, args.api_key, args.engine) == (
        "runs/kuhn", "127.0.0.1", 9001, "k", "vllm",
    )  # fmt: skip
    defaults = build_parser().parse_args(["serve", "tiny"])
    assert (defaults.host, defaults.port, defaults.api_key, defaults.engine) == (
        "127.0.0.1", 8000, None, "local",
    )  # fmt: skip


def test_vllm_command_serves_the_same_checkpoint() -> None:
    cmd = vllm_command("runs/kuhn/checkpoints/iter_000010/model", port=9000,
                       served_model_name="kuhn")  # fmt: skip
    assert cmd[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model",
                        "runs/kuhn/checkpoints/iter_000010/model"]  # fmt: skip
    joined = " ".join(cmd)
    assert "--port 9000" in joined and "--host 127.0.0.1" in joined
    assert "--api-key" not in joined  # the key goes in VLLM_API_KEY, out of sight of ps
    assert "--served-model-name kuhn" in joined
    assert "--logprobs-mode processed_logprobs" in joined


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed")
def test_vllm_engine_without_vllm_says_what_to_install() -> None:
    with pytest.raises(ImportError, match="pip install vllm"):
        serve_vllm("tiny")
    assert "GPU" in VLLM_HINT


@pytest.mark.gpu
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM needs a GPU")
def test_vllm_serves_a_trained_checkpoint(lora_run: Path) -> None:  # pragma: no cover - GPU
    import subprocess
    import time

    import httpx

    from mage_rl.serve import free_port

    port = free_port()
    cmd = vllm_command(resolve_model(str(lora_run)), port=port, served_model_name="trained")
    process = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        reply = client.chat.completions.create(
            model="trained", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            logprobs=True, extra_body={"return_token_ids": True},
        )  # fmt: skip
        data = reply.model_dump()
        assert data["prompt_token_ids"] and data["choices"][0]["token_ids"]
    finally:
        process.terminate()
        process.wait(60)
