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


def test_conversation_rollouts_sample_the_same_with_and_without_reuse() -> None:
    from mage_rl import runtime
    from mage_rl.bench.rollout import rollout_setup
    from mage_rl.policy.chat_model import PolicyChatModel
    from mage_rl.policy.engine import LocalEngine

    cfg, lm, tokenizer, graph, tasks = rollout_setup(
        "tiny", 1, "kuhn_poker", 2, 6, "fp32", 0, "conversation"
    )

    def play(prefix_cache_mb: float) -> tuple[list, int]:
        # One meta-episode: its calls follow each other, so the draws cannot depend on
        # which requests happen to share a batch.
        with LocalEngine(lm, tokenizer, seed=0, prefix_cache_mb=prefix_cache_mb) as engine:
            llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=6, seed=0)
            records = runtime.run_rollouts(cfg, graph, llm, tasks, group_size=1)
            return [t for r in records for t in r.turns], engine.stats.reused_tokens

    reused_turns, reused = play(1024)
    plain_turns, none = play(0)
    assert reused > 0 and none == 0 and len(reused_turns) == len(plain_turns) > 2
    for a, b in zip(reused_turns, plain_turns, strict=True):
        assert a.prompt_ids == b.prompt_ids and a.response_ids == b.response_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
