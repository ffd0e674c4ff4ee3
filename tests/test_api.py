"""The Python API of the README tour: load a config, train, evaluate, load the agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mage_rl

REPO = Path(__file__).resolve().parents[1]


def test_train_evaluate_and_play_from_python(tmp_path: Path) -> None:
    cfg = mage_rl.load_config(
        REPO / "configs" / "kuhn_tiny.yaml",
        ["train.iterations=1", "eval.tasks=0", "eval.before=false", "rollout.group_size=2"],
    )
    summary = mage_rl.train(cfg, tmp_path / "run")
    assert Path(summary["checkpoint"]).parent.name == "iter_000001"

    results = mage_rl.evaluate(
        [f"mage={tmp_path / 'run'}", "reflexion=tiny"], tmp_path / "eval", n=2
    )
    trained, other = results["agents"]
    assert trained["run"] == str(tmp_path / "run") and trained["play"]["max_tokens"] == 24
    assert other["play"]["max_tokens"] == 96  # an agent without a run: the defaults
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["results"]["mage"]

    with mage_rl.load_agent(tmp_path / "run", ["policy.max_tokens=8"]) as agent:
        assert agent.config.meta.context == "reflection" and agent.config.policy.explore == 0
        record = agent.play(seed=3, opponent="kuhn_poker:aggressive", seat="second")
    assert record.opponent == "kuhn_poker:aggressive" and record.seat == 1
    assert record.turns and all(t.max_response_length <= 16 for t in record.turns)

    with pytest.raises(ValueError, match="not a training run"):
        mage_rl.load_agent(tmp_path)


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        mage_rl.nothing  # noqa: B018
