"""``mage bench sampling``: both ways of sampling keep the same tokens, and the figures are
measured, not written."""

from __future__ import annotations

import json

import pytest

from mage_rl.bench.sampling import bench_sampling
from mage_rl.cli import main


def test_every_setting_and_batch_is_timed_on_both_sides(tmp_path, capsys) -> None:
    out = tmp_path / "sampling.json"
    argv = ["bench", "sampling", "--batches", "1,4", "--vocab", "500", "--repeats", "2",
            "--threads", "1", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [(r["setting"], r["batch"]) for r in rows] == [
        ("free", 1),
        ("free", 4),
        ("evaluation", 1),
        ("evaluation", 4),
    ]
    for row in rows:
        assert row["same_tokens_kept"] is True
        for side in ("engine", "plain"):
            assert row[side]["step_ms"] == pytest.approx(
                row[side]["logprobs_ms"] + row[side]["draw_ms"]
            )
            assert row[side]["draw_ms"] > 0
        assert row["speedup"] == pytest.approx(row["plain"]["step_ms"] / row["engine"]["step_ms"])
    assert doc["provenance"]["torch_threads"] == 1
    assert "| evaluation | 4 |" in capsys.readouterr().out


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="batch sizes"):
        bench_sampling(batches=[0])
