"""Advantage estimators registered by name (``advantages.estimator``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn
from mage_rl.rl.advantages import AdvantageConfig, compute_advantages, credit_parts
from mage_rl.rl.estimators import register_estimator
from mage_rl.sections import ESTIMATORS, known_estimators

EXAMPLES = Path(__file__).parents[2] / "examples" / "extending"


def _record(seed: int, rewards: list[float]) -> MetaEpisodeRecord:
    turns = [Turn(kind="play", episode=k, step=0, anchor="s", response_length=1,
                  max_response_length=8) for k in range(len(rewards))]  # fmt: skip
    return MetaEpisodeRecord(
        uid="g", rollout=seed, env="kuhn_poker", seed=0, opponent="kuhn:passive", seat=0,
        episodes=[EpisodeResult(index=k, outcome="won", reward=r) for k, r in enumerate(rewards)],
        turns=turns,
    )  # fmt: skip


@pytest.fixture()
def last_only():
    def fn(records, returns, advantages):
        return [[r.episodes[-1].reward] * len(r.turns) for r in records]

    register_estimator("test_last_only", fn, replace=True)
    yield "test_last_only"
    ESTIMATORS._entries.pop("test_last_only", None)
    ESTIMATORS._aliases.pop("test_last_only", None)


def test_a_registered_estimator_gives_the_advantages(last_only: str) -> None:
    records = [_record(0, [1.0, -1.0]), _record(1, [0.0, 5.0])]
    cfg = AdvantageConfig(estimator=last_only)
    assert compute_advantages(records, adv_cfg=cfg) == [[-1.0, -1.0], [5.0, 5.0]]
    credit = credit_parts(records, adv_cfg=cfg)
    assert credit[1][0].a_episode == 5.0 and credit[1][0].a_step == 0.0
    assert math.isnan(credit[1][0].ret)  # it gave no return: none is invented
    assert last_only in known_estimators()


def test_estimator_names_are_checked() -> None:
    with pytest.raises(ValueError, match=r"one of \['gigpo', 'grpo'.*--plugin"):
        AdvantageConfig(estimator="nope")
    with pytest.raises(ValueError, match="built-in"):
        register_estimator("gigpo", lambda *a: [])


def test_an_estimator_with_the_wrong_shape_is_refused() -> None:
    register_estimator("test_short", lambda records, *_: [[0.0] for _ in records], replace=True)
    try:
        with pytest.raises(ValueError, match="gave record 0 1 advantages for its 2 turns"):
            compute_advantages(
                [_record(0, [1.0, 2.0])], adv_cfg=AdvantageConfig(estimator="test_short")
            )
    finally:
        ESTIMATORS._entries.pop("test_short", None)
        ESTIMATORS._aliases.pop("test_short", None)


def test_a_run_trains_with_an_estimator_from_a_plugin(tmp_path: Path) -> None:
    plugin = tmp_path / "credit.py"
    plugin.write_text(
        "from mage_rl.rl.estimators import register_estimator\n"
        "def last_episode(records, returns, advantages):\n"
        "    return [[(r.episodes[-1].reward if r.episodes else 0.0)] * len(r.turns)"
        " for r in records]\n"
        "register_estimator('last_episode', last_episode, replace=True)\n"
    )
    run = tmp_path / "run"
    code = main(["--plugin", str(plugin), "train", str(EXAMPLES / "planner_kuhn_tiny.yaml"),
                 "--run-dir", str(run), "--no-progress", "--set", "train.iterations=1",
                 "--set", "eval.tasks=0", "--set", "advantages.estimator=last_episode"])  # fmt: skip
    assert code == 0
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert "nodes/act/advantage_mean" in row and "nodes/act/return_mean" not in row
    assert "last_episode" in (run / "config.yaml").read_text()
