"""`mage train` for one iteration on the tiny configs of Leduc Hold'em and Liar's Dice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config

CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.mark.parametrize("game", ["leduc", "liars_dice"])
def test_smollm2_config_loads(game: str) -> None:
    cfg = load_config(CONFIGS / f"{game}_smollm2.yaml", [], TrainConfig)
    assert cfg.policy.model == "smollm2"
    assert cfg.env.population == f"{game}_train"


# The exact first-seat best fixed value of each training population (`mage oracle`).
BEST_FIXED_FIRST = {"leduc": "+1.1633", "liars_dice": "+0.7833"}


@pytest.mark.parametrize("game", ["leduc", "liars_dice"])
def test_tiny_config_trains_one_iteration(game: str, tmp_path: Path) -> None:
    run = tmp_path / game
    code = main(
        [
            "train",
            str(CONFIGS / f"{game}_tiny.yaml"),
            "--set",
            "train.iterations=1",
            "--set",
            "rollout.tasks=2",
            "--set",
            "rollout.group_size=2",
            "--set",
            "meta.episodes=2",
            "--set",
            "eval.tasks=2",
            "--set",
            "env.max_turns=2",
            "--run-dir",
            str(run),
            "--no-progress",
        ]
    )
    assert code == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["iteration"] == 1
    assert "charts/success@1" in lines[0] and "losses/loss" in lines[0]
    assert (run / "checkpoints" / "iter_000001" / "model" / "config.json").exists()
    report = (run / "report.md").read_text()
    assert f"Exact values for this population (`mage oracle {game}`)" in report
    assert f"first seat: best fixed {BEST_FIXED_FIRST[game]}" in report
