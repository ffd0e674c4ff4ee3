"""``mage bench layouts`` on the tiny model: real meta-episodes in both layouts, rollouts
with and without prefix reuse, then learner updates (the SmolLM2 figures are in the docs)."""

from __future__ import annotations

import json

from mage_rl.bench.layouts import PARTS, bench_layouts, format_layouts_report
from mage_rl.cli import main


def test_both_layouts_play_and_train_the_same_calls_differently() -> None:
    result = bench_layouts("tiny", meta_episodes=2, episodes=2, max_tokens=8)
    rr, conv = result["layouts"]["rerendered"], result["layouts"]["conversation"]
    for layout in (rr, conv):
        off, on = layout["rollout"]["without_reuse"], layout["rollout"]["with_reuse"]
        assert off["reused_tokens"] == 0 < on["reused_tokens"]
        assert on["prefilled_tokens"] < off["prefilled_tokens"]
        # Both engines play the same games: the same calls and tokens.
        assert on["llm_calls"] == off["llm_calls"]
        assert layout["learner"]["steps"] == 1
    # One sample per call re-rendered, one sequence per meta-episode in the conversation.
    assert (
        rr["learner"]["samples"]
        == rr["learner"]["calls"]
        == rr["rollout"]["with_reuse"]["llm_calls"]
    )
    assert conv["learner"]["samples"] == 2
    assert conv["learner"]["calls"] == conv["rollout"]["with_reuse"]["llm_calls"]
    ratios = result["ratios"]
    assert ratios["learner_tokens"] == (
        rr["learner"]["tokens_per_meta_episode"] / conv["learner"]["tokens_per_meta_episode"]
    )
    assert ratios["learner_tokens"] > 1.5  # a K=2 chat re-reads little of itself
    # The conversation's parts add up to its whole sequence, which the learner trains.
    parts = conv["tokens"]
    assert sum(parts[p]["tokens"] for p in PARTS) == parts["total"]["tokens"]
    assert parts["total"]["tokens"] == conv["learner"]["tokens_per_meta_episode"]
    assert parts["first prompt"]["messages"] == 1
    replies = parts["play replies"]["messages"] + parts["reflections"]["messages"]
    assert replies * 2 == conv["rollout"]["with_reuse"]["llm_calls"]
    assert parts["reflect requests"]["messages"] == parts["reflections"]["messages"] == 1
    report = format_layouts_report(result)
    assert "Re-rendered / conversation" in report and "| observations |" in report


def test_cli_writes_the_result_with_its_provenance(tmp_path) -> None:
    out = tmp_path / "layouts.json"
    argv = ["bench", "layouts", "--model", "tiny", "--meta-episodes", "2", "--episodes", "1"]
    argv += ["--max-tokens", "8", "--repeats", "0", "--threads", "1", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["env"] == "kuhn_poker" and doc["config"]["constrain"] is True
    assert doc["provenance"]["torch_threads"] == 1
