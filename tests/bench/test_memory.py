"""``mage bench memory`` on the tiny Kuhn config: a row per phase, what glibc holds."""

from __future__ import annotations

import json

from mage_rl.cli import main
from mage_rl.memory import can_release


def test_memory_rows_per_phase_with_the_allocators_view(tmp_path, capsys) -> None:
    out = tmp_path / "memory.json"
    argv = ["bench", "memory", "configs/kuhn_tiny.yaml", "--set", "rollout.tasks=2",
            "--set", "rollout.group_size=2", "--iterations", "2", "--threads", "1"]  # fmt: skip
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["at"] for r in rows] == ["set-up", "iteration 1: rollouts", "iteration 1: update",
                                       "iteration 2: rollouts", "iteration 2: update"]  # fmt: skip
    for row in rows[1:]:
        assert 0 < row["rss_mb"] <= row["peak_mb"] + 1  # the sampled peak, give or take a page
        assert row["seconds"] > 0
        if can_release():  # glibc: its view of the heap is there too
            assert row["in_use_mb"] > 0 and row["free_kept_mb"] >= 0
    assert doc["config"]["release"] is True and doc["provenance"]["torch_threads"] == 1
    assert doc["config"]["tree_pad"] == 64
    assert "| iteration 2: update |" in capsys.readouterr().out
