"""One training sequence per meta-episode: the conversation sample trains like its calls."""

from __future__ import annotations

import copy

import pytest
import torch

from mage_rl.policy.constrained import allowed_next, choice_token_ids
from mage_rl.policy.conversation import ConversationTemplate
from mage_rl.policy.tiny import build_tiny
from mage_rl.records import MetaEpisodeRecord, Turn
from mage_rl.rl.batching import (
    ConversationSample,
    Sample,
    Segment,
    collate,
    conversation_sample,
    samples_from_records,
)
from mage_rl.rl.conversation import ConversationTrace, record_conversation
from mage_rl.rl.learner import Learner, LearnerConfig
from mage_rl.rl.packing import cut_mini_batches

CHOICES = ("<action>PASS</action>", "<action>BET</action>")


@pytest.fixture(scope="module")
def tiny_pair():
    return build_tiny(seed=0)


def _constrained(tokenizer, pick: int) -> tuple[list[int], list[list[int]]]:
    """A constrained response and the allowed set of each of its positions."""
    candidates = choice_token_ids(tokenizer, CHOICES)
    ids = candidates[pick]
    return ids, [allowed_next(candidates, ids[:j]) for j in range(len(ids))]


def meta_episode(tokenizer, seed: int) -> tuple[list[int], list[tuple[int, int, list]]]:
    """A conversation of six calls, constrained and free mixed, from the real template.

    Returns the conversation's ids and, per call, ``(start, end, allowed)``.
    """
    g = torch.Generator().manual_seed(seed)
    template = ConversationTemplate(tokenizer)
    conv = template.start(
        [
            {"role": "system", "content": "You are player 0 in Kuhn Poker."},
            {"role": "user", "content": "Episode 1 of 2. Your card is Queen."},
        ]
    )
    plain = [i for i in range(len(tokenizer)) if i not in tokenizer.all_special_ids]
    allowed_per_call = []
    # play (constrained), play (free), reflect (free), play (constrained), play
    # (constrained), play (free, ends with EOS)
    for call, kind in enumerate(["c", "f", "f", "c", "c", "f"]):
        if kind == "c":
            ids, allowed = _constrained(tokenizer, (call + seed) % 2)
        else:
            n = int(torch.randint(3, 12, (1,), generator=g))
            ids = [plain[int(i)] for i in torch.randint(0, len(plain), (n,), generator=g)]
            ids = ids + [tokenizer.eos_token_id] if call == 5 else ids
            allowed = []
        allowed_per_call.append(allowed)
        conv = template.append_response(conv, ids, tokenizer.decode(ids, skip_special_tokens=True))
        content = f"Observation {call}: the opponent played BET. Legal actions: PASS, BET."
        conv = template.append_messages(conv, [{"role": "user", "content": content}])
    spans = [
        (s, e, allowed) for (s, e), allowed in zip(conv.segments, allowed_per_call, strict=True)
    ]
    return list(conv.ids), spans


def both_layouts(learner: Learner, tokenizer, seeds=(1, 2)):
    """The same meta-episodes as conversation samples and as per-call samples.

    Each call's prompt is exactly the conversation before its response. The old
    log-probs are the policy's own plus noise, so that the PPO ratio moves off 1 and
    clipping is active on some tokens; every call has its own advantage.
    """
    conversations, per_call = [], []
    g = torch.Generator().manual_seed(7)
    for seed in seeds:
        ids, spans = meta_episode(tokenizer, seed)
        calls = [
            Sample(ids[:s], ids[s:e], [0.0] * (e - s), 0.0, allowed) for s, e, allowed in spans
        ]
        fresh = learner.compute_logprobs(calls)
        segments = []
        for (s, e, allowed), logp in zip(spans, fresh, strict=True):
            old = (torch.tensor(logp) + 0.4 * torch.randn(e - s, generator=g)).tolist()
            advantage = float(torch.randn(1, generator=g)) * 2
            segments.append(Segment(s, e, old, advantage, allowed))
            per_call.append(Sample(ids[:s], ids[s:e], old, advantage, allowed))
        conversations.append(ConversationSample(ids, segments))
    return conversations, per_call


def _grads(learner: Learner) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.detach().clone()
        for n, p in learner.model.named_parameters()
        if p.grad is not None
    }


def test_conversation_loss_and_gradients_equal_per_call_training(tiny_pair) -> None:
    model, tokenizer = tiny_pair
    config = LearnerConfig(dtype="fp32", kl_coef=0.1, entropy_coef=0.01, micro_batch_tokens=512)
    # Reference weights a step away from the policy, so the KL term is not zero.
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    conv_learner = Learner(copy.deepcopy(model), config, ref_model=copy.deepcopy(reference))
    call_learner = Learner(copy.deepcopy(model), config, ref_model=copy.deepcopy(reference))
    conversations, per_call = both_layouts(conv_learner, tokenizer)
    assert any(seg.allowed for c in conversations for seg in c.segments)
    assert any(not seg.allowed for c in conversations for seg in c.segments)

    conv_stats = conv_learner.accumulate_gradients(conversations)
    call_stats = call_learner.accumulate_gradients(per_call)
    for name in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "approx_kl", "free_frac"):
        assert conv_stats[name] == pytest.approx(call_stats[name], abs=1e-5), name
    assert 0 < call_stats["clip_frac"] < 1 and call_stats["kl"] > 1e-4
    conv_grads, call_grads = _grads(conv_learner), _grads(call_learner)
    assert conv_grads.keys() == call_grads.keys() and conv_grads
    for name, grad in call_grads.items():
        torch.testing.assert_close(conv_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)
    assert max(float(g.abs().max()) for g in call_grads.values()) > 1e-3

    # A whole update (one mini-batch of all calls) leaves the same weights behind, and
    # reads far fewer tokens.
    for learner in (conv_learner, call_learner):
        learner.optimizer.zero_grad(set_to_none=True)
    conv_update = conv_learner.update(conversations)
    call_update = call_learner.update(per_call)
    assert conv_update["steps"] == call_update["steps"] == 1
    assert conv_update["tokens"] == call_update["tokens"]
    assert conv_update["loss"] == pytest.approx(call_update["loss"], abs=1e-5)
    for (name, a), b in zip(
        conv_learner.model.named_parameters(), call_learner.model.parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)
    conv_read = sum(c.length for c in conversations)
    assert conv_read < sum(s.length for s in per_call) / 2


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward cannot skip logits: the learner reads all of them."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, use_cache=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache)


def test_logprobs_of_a_conversation_are_its_calls_logprobs(tiny_pair) -> None:
    model, tokenizer = tiny_pair
    learner = Learner(copy.deepcopy(model), LearnerConfig(dtype="fp32"))
    conversations, per_call = both_layouts(learner, tokenizer, seeds=(3,))
    calls = torch.tensor([x for c in learner.compute_logprobs(per_call) for x in c])
    (conv,) = learner.compute_logprobs(conversations)
    torch.testing.assert_close(torch.tensor(conv), calls)
    # The trainer refreshes old log-probs this way: each segment gets its own slice.
    refreshed = conversations[0].with_old_logprobs(conv)
    at = 0
    for seg in refreshed.segments:
        assert list(seg.old_logprobs) == conv[at : at + seg.length]
        at += seg.length
    plain = Learner(_NoLogitsToKeep(copy.deepcopy(model)), LearnerConfig(dtype="fp32"))
    (conv,) = plain.compute_logprobs(conversations)
    torch.testing.assert_close(torch.tensor(conv), calls)


def test_collate_lays_segments_out_like_their_calls(tiny_pair) -> None:
    _, tokenizer = tiny_pair
    ids, spans = meta_episode(tokenizer, 1)
    sample = ConversationSample(
        ids, [Segment(s, e, [0.1] * (e - s), float(k), a) for k, (s, e, a) in enumerate(spans)]
    )
    batch = collate([sample, Sample([1, 2], [3], [0.5], 9.0)])
    r = sample.num_response_tokens
    assert batch.input_ids.shape == (2, spans[-1][1])  # nothing after the last segment
    expected = [p for s, e, _ in spans for p in range(s - 1, e - 1)]
    assert batch.positions[0, :r].tolist() == expected
    assert batch.response_ids[0, :r].tolist() == [t for s, e, _ in spans for t in ids[s:e]]
    assert batch.advantages[0, :r].tolist() == [
        float(k) for k, (s, e, _) in enumerate(spans) for _ in range(e - s)
    ]
    assert (
        batch.mask[0].sum() == r
        and batch.mask[1].tolist()[:1] == [1.0]
        and batch.mask[1, 1:].sum() == 0
    )
    # Free segments of a conversation with constrained ones are unrestricted (all -1).
    restricted = (batch.allowed_index[0, :r] >= 0).any(-1).tolist()
    assert restricted == [bool(a) for s, e, a in spans for _ in range(e - s)]
    assert batch.min_prompt_len == 2 and batch.conversation


def test_invalid_conversation_samples_are_refused() -> None:
    ok = Segment(2, 4, [0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="overlaps the one before"):
        ConversationSample(list(range(8)), [ok, Segment(3, 5, [0.0] * 2, 1.0)]).validate(0)
    with pytest.raises(ValueError, match="after at least one prompt token"):
        ConversationSample(list(range(8)), [Segment(0, 2, [0.0] * 2, 1.0)]).validate(0)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        ConversationSample(list(range(8)), [Segment(2, 4, [0.0], 1.0)]).validate(0)
    with pytest.raises(ValueError, match="not in its allowed set"):
        ConversationSample(list(range(8)), [Segment(2, 4, [0.0] * 2, 1.0, [[2], [5]])]).validate(3)
    with pytest.raises(ValueError, match="runs past"):
        ConversationTrace(ids=[1, 2, 3], segments=[(1, 5, 0)])


def test_mini_batches_count_calls_and_never_split_a_conversation() -> None:
    assert cut_mini_batches([0, 1, 2, 3, 4], [1] * 5, 2) == [[0, 1], [2, 3], [4]]
    assert cut_mini_batches([2, 0, 1, 3], [6, 1, 3, 2], 4) == [[2], [0], [1, 3]]
    assert cut_mini_batches([0, 1], [9, 9], 4) == [[0], [1]]


def _record(tokenizer) -> tuple[MetaEpisodeRecord, list[int], list]:
    ids, spans = meta_episode(tokenizer, 1)
    turns = [
        Turn(kind="play", episode=0, step=k, prompt_ids=ids[:s], response_ids=ids[s:e],
             logprobs=[-0.5] * (e - s), allowed=a)
        for k, (s, e, a) in enumerate(spans)
    ]  # fmt: skip
    # A seventh call outside the conversation (e.g. a summary rendered on its own).
    turns.append(
        Turn(kind="play", episode=1, step=0, prompt_ids=[1, 2], response_ids=[3], logprobs=[-1.0])
    )
    record = MetaEpisodeRecord(
        uid="u", rollout=0, env="kuhn_poker", seed=0, opponent="o", seat=0, turns=turns
    )
    return record, ids, spans


def test_records_with_a_conversation_become_one_sample(tiny_pair) -> None:
    _, tokenizer = tiny_pair
    record, ids, spans = _record(tokenizer)
    advantages = [float(k) for k in range(len(record.turns))]
    per_call = samples_from_records([record], [advantages])
    assert [type(s) for s in per_call] == [Sample] * 7

    trace = ConversationTrace(ids=ids, segments=[(s, e, k) for k, (s, e, _) in enumerate(spans)])
    record.conversation = trace  # what the record's field will hold
    samples = samples_from_records([record], [advantages])
    assert [type(s) for s in samples] == [ConversationSample, Sample]
    conv = samples[0]
    assert [(g.start, g.end, g.advantage) for g in conv.segments] == [
        (s, e, float(k)) for k, (s, e, _) in enumerate(spans)
    ]
    assert [list(g.allowed) for g in conv.segments] == [a for _, _, a in spans]
    assert samples[1].prompt_ids == [1, 2] and samples[1].advantage == 6.0
    # The same through JSON: the record stores the trace's dict form.
    record.conversation = trace.to_dict()
    assert record_conversation(record) == ConversationTrace.from_dict(trace.to_dict())
    assert samples_from_records([record], [advantages]) == samples

    bad = ConversationTrace(ids=ids, segments=[(spans[0][0], spans[0][1], 1)])
    with pytest.raises(ValueError, match="does not hold that turn's response ids"):
        conversation_sample(bad, record.turns, advantages, "u")
    twice = ConversationTrace(ids=ids, segments=[(s, e, 0) for s, e, _ in spans[:2]])
    with pytest.raises(ValueError, match="another segment already trains"):
        conversation_sample(twice, record.turns, advantages, "u")
