"""``scripts/gpu_check.sh``: its device half, dry-run on the CPU, so the script cannot rot
between the rare tasks that are lent a GPU (scripts/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None,
    reason="the script needs bash and coreutils' timeout",
)


def test_dry_run_runs_every_step_and_writes_json_with_provenance(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out)}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["mode"] == "dry-run"
    assert "commit" in summary["provenance"]
    steps = [s["step"] for s in summary["steps"]]
    assert steps == ["env", "pytest_gpu", "hardware_tiny", "pytest_cpu"]
    assert summary["tests"]["pytest_cpu"]["passed"] > 0
    assert summary["tests"]["pytest_cpu"]["failed"] == 0
    assert summary["hardware"]["tiny"]["learner_share"] > 0
    hardware = json.loads((out / "hardware_tiny.json").read_text())
    assert hardware["provenance"]["command"].startswith("mage bench hardware")
    assert hardware["profile"]["ops"], "the dry run profiles one update"
    for part in ("env.json", "logs/hardware_tiny.log"):
        assert (out / part).is_file()


def test_steps_variable_reruns_only_the_named_steps(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_STEPS": "pytest"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    rows = dict(line.split("\t")[:2] for line in (out / "steps.tsv").read_text().splitlines())
    assert rows["env"] == "0" and rows["hardware_tiny"] == "not asked"
    assert rows["pytest_gpu"] == "0" and rows["pytest_cpu"] == "0"
    assert json.loads((out / "summary.json").read_text())["ok"]


def test_prepare_plan_pins_every_core_wheel_to_an_installed_version() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "prepare", "unused", "64", "2",
         "--plan"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    core = next(line for line in done.stdout.splitlines() if line.startswith("core"))
    assert "mage-rl==" in core and "pydantic-core==" in core and "open-spiel==" in core
    assert "==?" not in core, core
