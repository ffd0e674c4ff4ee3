"""Paired differences: task by task, over the tasks both sides played, stratified where the
evaluation was, and inside the range a difference can take."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mage_rl.eval.paired import episode_payoffs, episode_value, paired_difference
from mage_rl.eval.stats import t_quantile
from mage_rl.eval.stratified import StratifiedDesign
from mage_rl.graphs.rollouts import TaskInstance


def test_a_plain_paired_difference_by_hand() -> None:
    a = {(0, "x", 0): 1.0, (1, "x", 0): 0.0, (2, "y", 0): 1.0, (9, "y", 0): 5.0}
    b = {(0, "x", 0): 0.0, (1, "x", 0): -1.0, (2, "y", 0): 1.0, (3, "y", 0): -9.0}
    found = paired_difference(a, b)
    # Only the three shared tasks: differences 1, 1, 0.
    assert found["tasks"] == 3 and not found["stratified"]
    diff = found["difference"]
    half = t_quantile(0.95, 2) * math.sqrt((1 / 3) / 3)
    assert diff["mean"] == pytest.approx(2 / 3)
    assert (diff["low"], diff["high"]) == pytest.approx((2 / 3 - half, 2 / 3 + half))


def test_the_interval_stays_inside_the_range_of_a_difference() -> None:
    a = {(i, "x", 0): 1.0 for i in range(4)} | {(4, "x", 0): -1.0}
    b = {(i, "x", 0): -1.0 for i in range(4)} | {(4, "x", 0): 1.0}
    diff = paired_difference(a, b, bounds=(-1.0, 1.0))["difference"]
    assert diff["mean"] == pytest.approx(1.2)
    assert diff["high"] <= 2.0 and diff["low"] >= -2.0
    # Every difference the same: not a point, but Wilson's interval for its share.
    same = paired_difference({(0, "x", 0): 1.0, (1, "x", 0): 1.0},
                             {(0, "x", 0): 0.0, (1, "x", 0): 0.0}, bounds=(0.0, 1.0))  # fmt: skip
    assert same["difference"]["low"] < 1.0 == same["difference"]["mean"]


def test_a_stratified_difference_weighs_the_strata() -> None:
    tasks = [TaskInstance(s, opp, 0) for s, opp in ((0, "x"), (1, "x"), (2, "y"), (3, "y"))]
    design = StratifiedDesign(tasks, ["x|0|", "x|0|", "y|0|", "y|0|"], {"x|0|": 0.9, "y|0|": 0.1})
    a = {(0, "x", 0): 1.0, (1, "x", 0): 2.0, (2, "y", 0): 10.0, (3, "y", 0): 10.0}
    b = {t: 0.0 for t in a}
    found = paired_difference(a, b, design=design)
    assert found["stratified"] and found["difference"]["mean"] == pytest.approx(
        0.9 * 1.5 + 0.1 * 10
    )
    # A task outside the design: the plain mean, said so.
    c = a | {(7, "z", 0): 0.0}
    other = paired_difference(c, b | {(7, "z", 0): 1.0}, design=design)
    assert not other["stratified"] and other["tasks"] == 5


def test_episode_payoffs_reads_an_evaluation(tmp_path: Path) -> None:
    rows = [
        {"seed": 3, "opponent": "x", "seat": 1, "episodes": [{"payoff": 1.0}, {"payoff": None}]},
        {"seed": 4, "opponent": "x", "seat": 1, "episodes": [{"payoff": -0.5}]},
    ]
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found = episode_payoffs(path)
    assert found == {(3, "x", 1): [1.0, 0.0], (4, "x", 1): [-0.5]}
    assert episode_value(found[(4, "x", 1)], 1) == 0.0  # stopped before its second episode
