"""bench reuse on the tiny model: both settings play the same calls, reuse skips prefill."""

from __future__ import annotations

import pytest

from mage_rl.bench.reuse import bench_reuse, format_reuse_report


def test_bench_reuse_prefills_less_with_reuse_in_the_conversation_layout() -> None:
    result = bench_reuse(
        model="tiny", meta_episodes=2, episodes=2, max_tokens=6, dtype="fp32", rounds=1
    )
    without, with_ = result["settings"]["without_reuse"], result["settings"]["with_reuse"]
    assert without["reused_tokens"] == 0
    assert without["llm_calls"] == with_["llm_calls"] > 2
    # Every call after a meta-episode's first continues its conversation: most of its
    # prompt comes from the cache.
    assert with_["reused_tokens"] > with_["prefilled_tokens"]
    assert with_["prefilled_tokens"] + with_["reused_tokens"] == without["prefilled_tokens"]
    assert result["ratios"]["wall_s"] > 0
    report = format_reuse_report(result)
    assert "with reuse" in report and "conversation layout" in report


def test_bench_reuse_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="layout"):
        bench_reuse(model="tiny", layout="sideways")
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        bench_reuse(model="tiny", prefix_cache_mb=0)
