"""How mage finds and starts vLLM, checked without vLLM (these run in the default suite)."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from mage_rl.config import PolicyConfig
from mage_rl.policy.vllm_engine import (
    VLLM_PYTHON_ENV,
    VLLMServer,
    find_vllm_python,
    vllm_model_dir,
    vllm_server_command,
)


def test_the_named_python_wins_and_a_wrong_one_is_an_error(tmp_path) -> None:
    assert find_vllm_python({VLLM_PYTHON_ENV: sys.executable}) == sys.executable
    with pytest.raises(FileNotFoundError, match=VLLM_PYTHON_ENV):
        find_vllm_python({VLLM_PYTHON_ENV: str(tmp_path / "nope")})


def test_server_command_runs_the_module_with_processed_logprobs() -> None:
    cmd = vllm_server_command("/env/bin/python", "/m", port=9000, served_model_name="kuhn",
                              extra_args=["--dtype", "float32"])  # fmt: skip
    assert cmd[:5] == [
        "/env/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
    ]
    joined = " ".join(cmd)
    assert "--port 9000" in joined and "--served-model-name kuhn" in joined
    assert "--logprobs-mode processed_logprobs" in joined and joined.endswith("--dtype float32")


def test_a_server_that_dies_at_start_is_reported_with_its_log(tmp_path) -> None:
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho 'RuntimeError: operator torchvision::nms does not exist'\nexit 3\n"
    )
    fake.chmod(0o755)
    server = VLLMServer("/m", python=str(fake), log_path=tmp_path / "vllm.log", startup_timeout=30)
    with pytest.raises(RuntimeError, match=r"exited with status 3(.|\n)*torchvision::nms"):
        server.start()
    assert server.process is None  # closed, nothing left running


def test_dev_routes_stay_on_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        VLLMServer("/m", python=sys.executable, host="0.0.0.0", dev_endpoints=True)


def test_config_refuses_what_vllm_cannot_do() -> None:
    assert PolicyConfig().engine == "local"
    with pytest.raises(ValidationError, match="tiny model exists only in-process"):
        PolicyConfig(model="tiny", engine="vllm")
    with pytest.raises(ValidationError, match="constrain_actions"):
        PolicyConfig(model="smollm2", engine="vllm", constrain_actions=True)
    assert PolicyConfig(model="smollm2", engine="vllm").engine == "vllm"
    with pytest.raises(ValueError, match="save_pretrained"):
        vllm_model_dir("tiny")
