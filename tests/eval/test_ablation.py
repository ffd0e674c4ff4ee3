"""`mage ablate` on the tiny model: every variant and seed trained, compared, written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.eval.ablation import (
    across_seeds,
    bounded_mean_interval,
    implied,
    paired_last,
    parse_seeds,
    parse_vary,
    verdict,
)
from mage_rl.eval.ablation_cli import run_ablation

CONFIGS = Path(__file__).parents[2] / "configs"
TINY = [
    "policy.model=tiny", "policy.dtype=fp32", "learner.dtype=fp32", "policy.explore=0.0",
    "train.iterations=1", "rollout.tasks=2", "rollout.group_size=2", "rollout.concurrency=4",
    "learner.mini_batch_size=64", "eval.tasks=4",
]  # fmt: skip


def test_variants_are_every_combination_first_named_first() -> None:
    variants = parse_vary(
        ["returns.mode=differential,single_episode", "advantages.anchor=global,local"]
    )
    assert [v.name for v in variants][:2] == [
        "returns.mode=differential, advantages.anchor=global",
        "returns.mode=differential, advantages.anchor=local",
    ]
    assert len(variants) == 4 and len({v.slug for v in variants}) == 4
    assert implied(variants[0]) == [] and implied(variants[2]) == ["returns.reward_to_go=false"]
    for bad in (["returns.mode"], ["returns.mode="], ["a=1", "a=2"], ["a=1,1"]):
        with pytest.raises(ValueError):
            parse_vary(bad)
    assert parse_seeds("0, 2") == [0, 2]
    for bad in ("", "x", "1,1"):
        with pytest.raises(ValueError):
            parse_seeds(bad)


def test_intervals_stay_in_range_and_never_collapse() -> None:
    flat = bounded_mean_interval([0.0] * 50, -1.5, 1.0)
    assert flat.mean == 0.0 and flat.low < 0.0 < flat.high
    assert flat.low >= -1.5 and flat.high <= 1.0
    near_top = bounded_mean_interval([1.0] * 19 + [0.0], -1.0, 1.0)
    assert near_top.high == 1.0 and near_top.low < near_top.mean
    assert bounded_mean_interval([1.0] * 5, None, None).low == 1.0  # no bounds: plain t


def test_paired_verdict() -> None:
    ep = lambda x: [{"payoff": 0.0}, {"payoff": x}]  # noqa: E731
    ref = {("o", s, 1): ep(1.0 if s % 4 else 0.0) for s in range(40)}
    other = {("o", s, 1): ep(0.0) for s in range(40)}
    paired = paired_last(ref, other, (-1.5, 1.0))
    assert paired["tasks"] == 40 and paired["difference"]["mean"] == pytest.approx(0.75)
    v = verdict(paired, {"low": 0.5, "high": 0.9}, {"low": -0.1, "high": 0.1})
    assert v["apart"] and v["intervals_apart"] and v["verdict"] == "apart"
    same = verdict(paired_last(other, other, (-1.5, 1.0)), {"low": -0.1}, {"high": 0.1})
    assert not same["apart"] and same["verdict"] == "not apart"


def test_the_verdict_across_seeds_holds_how_training_varies() -> None:
    def variant(diffs: list[float]) -> dict:
        return {"seeds": {str(i): {"verdict": {"difference": {"mean": d}}}
                          for i, d in enumerate(diffs)}}  # fmt: skip

    # The showdown's returns ablation (MAGE minus single-episode credit, per seed).
    found = across_seeds(variant([0.430, 0.320, 0.330]))
    assert found["seeds"] == 3 and found["difference"]["mean"] == pytest.approx(0.36)
    # t(0.975, 2) = 4.303; the spread of the three differences is 0.0608.
    assert found["difference"]["low"] == pytest.approx(0.36 - 4.303 * 0.0608 / 3**0.5, abs=1e-3)
    assert found["apart"] and found["verdict"] == "apart"
    # Two identical objectives that trained apart on two seeds of three: not apart here.
    same = across_seeds(variant([0.055, 0.0, 0.140]))
    assert not same["apart"] and same["verdict"] == "not apart"
    assert across_seeds(variant([0.5])) is None  # one seed: no spread to estimate


def test_ablate_runs_every_variant_and_seed(tmp_path: Path) -> None:
    out = tmp_path / "abl"
    args = ["ablate", str(CONFIGS / "showdown_smollm2.yaml"), "--vary",
            "returns.mode=differential,single_episode", "--seeds", "1", "--out", str(out)]  # fmt: skip
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    doc = json.loads((out / "ablation.json").read_text())
    assert doc["provenance"]["command"].startswith("mage ablate")
    assert [v["name"] for v in doc["variants"]] == [
        "returns.mode=differential",
        "returns.mode=single_episode",
    ]
    assert doc["variants"][1]["implied"] == ["returns.reward_to_go=false"]
    for variant in doc["variants"]:
        for seed in ("1",):
            run = variant["seeds"][seed]
            assert run["status"] == "done" and run["n"] == 4
            assert -1.5 <= run["last"]["low"] <= run["last"]["mean"] <= run["last"]["high"] <= 1.0
            assert 0.0 <= run["first_probe_share"]["mean"] <= 1.0
    single = doc["variants"][1]["seeds"]["1"]
    assert single["verdict"]["tasks"] == 4 and single["verdict"]["verdict"]
    assert doc["references"]["optimum_last"]["final"] == pytest.approx(0.5)
    md = (out / "ablation.md").read_text()
    assert "returns.mode=single_episode" in md and doc["provenance"]["started_at"] in md
    assert (out / "ablation.png").stat().st_size > 0
    cfg = (out / "runs" / "mode-single_episode" / "seed1" / "config.yaml").read_text()
    assert "single_episode" in cfg and "reward_to_go: false" in cfg
    # Run again: the finished runs are reused, nothing trains.
    assert main(args) == 0
    again = json.loads((out / "ablation.json").read_text())
    assert all(r.get("reused") for v in again["variants"] for r in v["seeds"].values())
    first = doc["variants"][0]["seeds"]["1"]
    reused = again["variants"][0]["seeds"]["1"]["trained"]
    assert reused["started_at"] and reused["wall_seconds"] > 0
    assert (reused["commit"], reused["dirty"]) == (
        doc["provenance"]["commit"],
        doc["provenance"]["dirty"],
    )
    assert again["variants"][0]["seeds"]["1"]["last"] == first["last"]
    assert "done (reused: trained at " in (out / "ablation.md").read_text()
    # A finished run whose settings are not the command's is refused before any training,
    # naming the folder and the setting.
    stale = out / "runs" / "mode-single_episode" / "seed1" / "config.yaml"
    stale.write_text(stale.read_text().replace("omega: 4.0", "omega: 1.0"))
    with pytest.raises(ValueError, match=r"seed1: advantages\.omega \(the run has 1\.0"):
        run_ablation(
            str(CONFIGS / "showdown_smollm2.yaml"),
            ["returns.mode=differential,single_episode"],
            "1",
            out,
            list(TINY),
        )
