"""How mage finds and starts vLLM, checked without vLLM (these run in the default suite)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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
    with pytest.raises(ValidationError, match="constrain_actions=True"):
        PolicyConfig(model="smollm2", engine="vllm", constrain_actions=True)
    assert PolicyConfig(model="smollm2", engine="vllm").engine == "vllm"
    with pytest.raises(ValueError, match="save_pretrained"):
        vllm_model_dir("tiny")


def test_bench_vllm_runs_the_local_half_and_refuses_unknown_engines() -> None:
    from mage_rl.bench.vllm import bench_vllm, format_vllm_report

    result = bench_vllm(model="tiny", meta_episodes=2, episodes=1, max_tokens=4, engines=["local"])
    local = result["engines"]["local"]
    assert local["meta_episodes"] == 2 and local["llm_calls"] >= 2
    assert 0 < local["mean_response_tokens"] <= 4  # play and reflect calls share the limit
    assert result["ratios"] == {} and "| local |" in format_vllm_report(result)
    with pytest.raises(ValueError, match="engines"):
        bench_vllm(engines=["sglang"])


def test_the_server_stops_when_mage_is_killed(tmp_path) -> None:
    pid_file = tmp_path / "server.pid"
    fake = tmp_path / "python"  # a "server" that never becomes healthy
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    fake.chmod(0o755)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from mage_rl.policy.vllm_server import VLLMServer; "
         f"VLLMServer('/m', python={str(fake)!r}, startup_timeout=600).start()"],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.1)
        server_pid = int(pid_file.read_text())
        parent.kill()  # SIGKILL: no atexit, no close()
        parent.wait()
        deadline = time.monotonic() + 20
        while _alive(server_pid):
            assert time.monotonic() < deadline, "the server outlived a killed mage"
            time.sleep(0.1)
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie has stopped
    except FileNotFoundError:
        return False
