"""The conversation-layout learner bench on the tiny model (the SmolLM2 figures are in the docs)."""

from __future__ import annotations

from mage_rl.bench.conversation import bench_conversation, build_layouts, format_conversation_report
from mage_rl.policy.tiny import build_tiny_tokenizer


def test_layouts_train_the_same_calls_on_fewer_tokens() -> None:
    tokenizer = build_tiny_tokenizer()
    per_call, conversations = build_layouts(tokenizer, "tic_tac_toe", "standard", 2, 2, seed=1)
    assert len(conversations) == 2
    assert len(per_call) == sum(c.num_calls for c in conversations)
    # The same responses, in the same order, with the same advantages.
    segments = [
        (list(c.ids[g.start : g.end]), g.advantage) for c in conversations for g in c.segments
    ]
    assert segments == [(list(s.response_ids), s.advantage) for s in per_call]
    texts = [tokenizer.decode(s.response_ids) for s in per_call]
    assert all(
        len(s.response_ids) <= (64 if "<remark>" in t else 32)
        for s, t in zip(per_call, texts, strict=True)
    )
    assert any(t.startswith("<remark>") for t in texts)
    # The first call's prompt is the same in both layouts.
    assert list(conversations[0].ids[: conversations[0].segments[0].start]) == list(
        per_call[0].prompt_ids
    )
    assert sum(s.length for s in per_call) > 1.5 * sum(c.length for c in conversations)


def test_bench_runs_on_the_tiny_model() -> None:
    result = bench_conversation(
        "tiny", "kuhn_poker", "compact", episodes=2, meta_episodes=2, kl_coef=0.0
    )
    rr, conv = result["layouts"]["re-rendered"], result["layouts"]["conversation"]
    assert rr["calls"] == conv["calls"] and conv["samples"] == 2
    assert rr["trained_tokens_per_meta_episode"] == conv["trained_tokens_per_meta_episode"]
    lean = result["layouts"]["re-rendered, response logits only"]
    assert lean["tokens_per_meta_episode"] == rr["tokens_per_meta_episode"]
    assert lean["trained_tokens_per_meta_episode"] == rr["trained_tokens_per_meta_episode"]
    assert result["ratios"]["tokens"] > 1.5
    assert rr["steps"] == conv["steps"] == 1
    assert "Re-rendered / conversation" in format_conversation_report(result)
