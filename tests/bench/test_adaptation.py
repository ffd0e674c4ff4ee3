"""mage bench adaptation on a tiny budget: the results document has the promised shape."""

from __future__ import annotations

import json

import pytest

from mage_rl.bench.adaptation import METHODS, bench_adaptation, format_table

SMALL = ["meta.episodes=2", "rollout.tasks=2", "rollout.group_size=2", "learner.mini_batch_size=8"]


def test_results_document_shape_and_resume(tmp_path) -> None:
    out = tmp_path / "adaptation.json"
    lines: list[str] = []
    doc = bench_adaptation(
        methods=["mage", "gigpo_single", "mage_mixed_groups"],
        seats=["first"],
        iterations=1,
        eval_every=1,
        out=out,
        overrides=SMALL,
        log=lines.append,
    )
    saved = json.loads(out.read_text())
    assert saved["results"].keys() == {"mage", "gigpo_single", "mage_mixed_groups"}
    for cell in (saved["results"][m]["first"] for m in saved["results"]):
        assert len(cell["ev_by_episode"]) == 2
        assert cell["last_episode_ev"] == cell["ev_by_episode"][-1]
        assert cell["seeds"] == [0]
        assert [p["iteration"] for p in cell["runs"][0]["curve"]] == [0, 1]
    gigpo = saved["results"]["gigpo_single"]["first"]["runs"][0]["config"]
    assert gigpo["meta"]["episodes"] == 1 and gigpo["rollout"]["group_size"] == 4
    assert saved["reference"]["first"]["best_fixed"] == pytest.approx(1 / 12)
    assert saved["reference"]["first"]["target"] == pytest.approx((1 / 12 + 0.2833) / 2, abs=1e-3)
    assert (tmp_path / "adaptation_curves.png").stat().st_size > 0
    assert "| mage |" in format_table(doc)
    # A second call keeps the finished runs instead of training again.
    lines.clear()
    bench_adaptation(
        methods=["mage"],
        seats=["first"],
        iterations=1,
        eval_every=1,
        out=out,
        overrides=SMALL,
        log=lines.append,
    )
    assert any("kept" in line for line in lines)


def test_unknown_method_is_named() -> None:
    with pytest.raises(ValueError, match="valid: " + ", ".join(METHODS)):
        bench_adaptation(methods=["nope"], out="unused.json")
