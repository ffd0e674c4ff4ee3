"""The ScienceWorld and TextWorld-Express configs load, and `mage train` runs one
iteration of each tiny config on the real simulators."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config

CONFIGS = Path(__file__).parents[2] / "configs"
ENVS = {"scienceworld": "scienceworld", "twx": "textworld_express"}
PRESETS = {"scienceworld": "scienceworld_train", "twx": "twx_train"}


@pytest.mark.parametrize("size", ["tiny", "smollm2"])
@pytest.mark.parametrize("task", ["scienceworld", "twx"])
def test_configs_load(task: str, size: str) -> None:
    cfg = load_config(CONFIGS / f"{task}_{size}.yaml", [], TrainConfig)
    assert cfg.env.name == ENVS[task] and cfg.env.seat == "first"
    assert cfg.env.population == PRESETS[task]
    assert cfg.policy.model == ("tiny" if size == "tiny" else "smollm2")
    assert cfg.returns.gamma_traj == 0.9
    assert (cfg.returns.invalid_penalty, cfg.returns.length_penalty) == (0.5, 1.0)


def train_one_iteration(task: str, run: Path) -> list[dict]:
    settings = {
        "train.iterations": 1,
        "rollout.tasks": 2,
        "rollout.group_size": 2,
        # One meta-episode at a time: one simulator, shared with the other tests.
        "rollout.concurrency": 1,
        "meta.episodes": 2,
        "eval.tasks": 1,
        "env.max_turns": 2,
    }
    argv = ["train", str(CONFIGS / f"{task}_tiny.yaml"), "--run-dir", str(run), "--no-progress"]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_twx_tiny_trains_one_iteration(tmp_path: Path) -> None:
    pytest.importorskip("textworld_express")
    lines = train_one_iteration("twx", tmp_path / "twx")
    assert lines[0]["iteration"] == 1 and "losses/loss" in lines[0]
    assert any(k.startswith("charts/opponent/") for k in lines[0])
    assert (tmp_path / "twx" / "checkpoints" / "iter_000001" / "model" / "config.json").exists()


@pytest.mark.slow
def test_scienceworld_tiny_trains_one_iteration(tmp_path: Path) -> None:
    pytest.importorskip("scienceworld")
    lines = train_one_iteration("scienceworld", tmp_path / "sw")
    assert lines[0]["iteration"] == 1 and "losses/loss" in lines[0]
    assert (tmp_path / "sw" / "checkpoints" / "iter_000001" / "model" / "config.json").exists()
