"""``mage bench learner-batch`` on the tiny Kuhn config: real rollouts, both layouts."""

from __future__ import annotations

import json

import pytest

from mage_rl.cli import main


@pytest.mark.slow
def test_trees_compute_fewer_tokens_for_the_same_gradient(tmp_path, capsys) -> None:
    out = tmp_path / "batch.json"
    argv = ["bench", "learner-batch", "configs/kuhn_tiny.yaml", "--set", "rollout.tasks=2"]
    argv += ["--set", "rollout.group_size=2", "--repeats", "1", "--threads", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    padded, tree = doc["layouts"]["padded"], doc["layouts"]["tree"]
    # The same samples, every Kuhn prompt opening alike: far fewer tokens computed.
    assert padded["sample_tokens"] == tree["sample_tokens"] > 0
    assert tree["fed_tokens"] * 2 < padded["fed_tokens"]
    agree = doc["agreement"]
    assert agree["tree"]["loss"] == pytest.approx(agree["padded"]["loss"], rel=1e-5, abs=1e-7)
    assert agree["paths"]["loss"] == pytest.approx(agree["padded"]["loss"], rel=1e-5, abs=1e-7)
    assert agree["grad_relative_difference"] < 1e-4
    assert agree["grad_relative_difference_paths"] < 1e-4
    assert doc["layouts"]["paths"]["fed_tokens"] == tree["fed_tokens"]
    assert doc["provenance"]["torch_threads"] == 1
    assert "tree / paths" in capsys.readouterr().out
