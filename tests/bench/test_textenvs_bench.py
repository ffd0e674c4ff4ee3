"""``mage bench textenvs`` on TextWorld-Express: times recorded, winning paths won."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.bench.textenvs import bench_textenvs, format_textenvs_report
from mage_rl.cli import main


def test_bench_textenvs_times_resets_and_steps(tmp_path: Path, capsys) -> None:
    pytest.importorskip("textworld_express")
    out = tmp_path / "textenvs.json"
    argv = ["bench", "textenvs", "--variant", "twx:coin:train:small", "--episodes", "2"]
    assert main([*argv, "--json", str(out)]) == 0
    assert "| textworld_express:coin:train:small |" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    (env,) = doc["envs"]
    assert env["gold_paths_won"] == 2 and len(env["gold_path_steps"]) == 2
    assert env["valid_step"]["n"] == sum(env["gold_path_steps"])
    assert env["invalid_step"]["n"] == env["reset_same_variation"]["n"] == 2
    assert 0 < env["valid_step"]["median_ms"] < 1000
    assert "provenance" in doc and doc["simulators"]["textworld-express"] == "1.1.0"


def test_bench_textenvs_refuses_other_environments() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        bench_textenvs(episodes=0)
    with pytest.raises(ValueError, match="not a ScienceWorld or TextWorld-Express"):
        bench_textenvs(["sokoban:boxes:2"], episodes=1)
    report = format_textenvs_report({"config": {"episodes": 1, "seed": 0}, "envs": []})
    assert report.startswith("Text worlds: 1 seeds")
