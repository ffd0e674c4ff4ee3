"""Constrained decoding: the engine samples a choice, the learner scores the same distribution."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from mage_rl.envs import make_env
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.graphs.rollouts import TaskInstance, record_from_state
from mage_rl.policy.base import RequestRejected, SamplingParams
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.constrained import (
    ChoiceCache,
    allowed_next,
    choice_token_ids,
    restricted_logprobs,
)
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny
from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.batching import Sample, samples_from_records
from mage_rl.rl.learner import Learner, LearnerConfig

CHOICES = ("<action>PASS</action>", "<action>BET</action>")
CHAT = [{"role": "user", "content": "Your card: K. Betting so far: none."}]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny(seed=3, init_std=0.05)


def _generate(engine: LocalEngine, params: list[SamplingParams], chat=CHAT):
    async def run():
        return await asyncio.gather(*(engine.generate(chat, p) for p in params))

    return asyncio.run(run())


def test_choices_tokenize_into_a_trie(tiny) -> None:
    _, tokenizer = tiny
    ids = choice_token_ids(tokenizer, CHOICES)
    assert [tokenizer.decode(x) for x in ids] == list(CHOICES)
    assert allowed_next(ids, []) == sorted({ids[0][0], ids[1][0]})
    # The shared prefix "<action>" leaves one token; the action token has two.
    split = next(j for j in range(min(map(len, ids))) if ids[0][j] != ids[1][j])
    assert allowed_next(ids, ids[0][:split]) == sorted({ids[0][split], ids[1][split]})
    with pytest.raises(ValueError, match="prefix"):
        choice_token_ids(tokenizer, ("<action>BET", "<action>BET</action>"))
    with pytest.raises(ValueError, match="distinct"):
        choice_token_ids(tokenizer, ("a", "a"))


def test_engine_samples_only_choices_with_restricted_logprobs(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, seed=0) as engine:
        gens = _generate(engine, [SamplingParams(choices=CHOICES, seed=i) for i in range(24)])
    texts = {g.text for g in gens}
    assert texts <= set(CHOICES)
    assert len(texts) == 2, "a near-uniform model should sample both choices in 24 draws"
    for gen in gens:
        assert len(gen.allowed) == len(gen.response_ids) == len(gen.logprobs)
        assert gen.finish_reason == "stop"
        for token, lp, allowed in zip(gen.response_ids, gen.logprobs, gen.allowed, strict=True):
            assert token in allowed
            if len(allowed) == 1:
                assert lp == 0.0
        # Exactly one position decides between the two choices; its two log-probs
        # (over the group of draws) are a proper distribution.
        assert sum(len(a) > 1 for a in gen.allowed) == 1
    split = next(j for j, a in enumerate(gens[0].allowed) if len(a) > 1)
    by_text = {g.text: g.logprobs[split] for g in gens}
    assert math.isclose(sum(math.exp(v) for v in by_text.values()), 1.0, rel_tol=1e-5)


def test_shared_leading_tokens_need_no_decode_step(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, seed=0) as engine:
        gens = _generate(engine, [SamplingParams(choices=CHOICES, seed=i) for i in range(8)])
        # "<action>" goes into the prefill, the action token is drawn from its logits, and
        # the rest of the chosen answer is appended: one forward pass per batch.
        assert engine.stats.forward_passes == engine.stats.batches
        assert engine.stats.generated_tokens == len(gens)
        shared = allowed_next(choice_token_ids(tokenizer, CHOICES), [])
        assert all(g.response_ids[0] == shared[0] and g.logprobs[0] == 0.0 for g in gens)
        # A single choice is answered whole without running the model.
        passes = engine.stats.forward_passes
        (only,) = _generate(engine, [SamplingParams(choices=CHOICES[:1], seed=0)])
        assert engine.stats.forward_passes == passes
    assert only.text == CHOICES[0] and only.finish_reason == "stop"
    assert only.logprobs == [0.0] * len(only.response_ids)
    assert all(len(a) == 1 for a in only.allowed)


def test_learner_scores_the_restricted_distribution(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, seed=0) as engine:
        params = [SamplingParams(choices=CHOICES, seed=i, temperature=0.7) for i in range(6)]
        params += [SamplingParams(max_tokens=6, seed=i, temperature=0.7) for i in range(3)]
        gens = _generate(engine, params)
    learner = Learner(model, LearnerConfig(temperature=0.7, kl_coef=0.0, dtype="fp32"))
    samples = [Sample(g.prompt_ids, g.response_ids, g.logprobs, 1.0, g.allowed) for g in gens]
    scored = learner.compute_logprobs(samples)
    for gen, lps in zip(gens, scored, strict=True):
        assert lps == pytest.approx(gen.logprobs, abs=1e-4)
    # Without the allowed sets the full-vocabulary softmax gives different numbers.
    free = learner.compute_logprobs(
        [Sample(g.prompt_ids, g.response_ids, g.logprobs, 1.0) for g in gens[:6]]
    )
    assert any(
        abs(a - b) > 1e-2
        for f, g in zip(free, gens, strict=True)
        for a, b in zip(f, g.logprobs, strict=True)
    )


def test_restricted_gradients_are_finite_and_zero_on_forced_tokens(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, seed=0) as engine:
        gens = _generate(
            engine,
            [SamplingParams(choices=CHOICES, seed=1), SamplingParams(max_tokens=5, seed=2)],
        )
    learner = Learner(model, LearnerConfig(kl_coef=0.1, entropy_coef=0.01, dtype="fp32"))
    samples = [Sample(g.prompt_ids, g.response_ids, g.logprobs, 1.0, g.allowed) for g in gens]
    learner.model.zero_grad()
    stats = learner.accumulate_gradients(samples)
    assert all(math.isfinite(v) for v in stats.values())
    grads = [p.grad for p in learner.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_restricted_logprobs_greedy_convention() -> None:
    logits = torch.tensor([0.0, 2.0, 1.0, 5.0])
    out = restricted_logprobs(logits, 0.0, [1, 2])
    assert out[3] == float("-inf") and out[0] == float("-inf")
    assert torch.allclose(out[[1, 2]], torch.log_softmax(torch.tensor([2.0, 1.0]), -1))
    hot = restricted_logprobs(logits, 2.0, [1, 2])
    assert torch.allclose(hot[[1, 2]], torch.log_softmax(torch.tensor([1.0, 0.5]), -1))


def test_constrained_kuhn_meta_episode_is_always_valid_and_trainable(tiny) -> None:
    model, tokenizer = tiny
    options = GraphOptions(
        num_episodes=3,
        context="history",
        protocol="fresh",
        stop_on_success=False,
        prompt="compact",
        constrain_actions=True,
    )
    graph = mage_graph(options)
    with LocalEngine(model, tokenizer, seed=0) as engine:
        chat = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=16)
        state = asyncio.run(
            graph.run(
                make_env("kuhn", "kuhn:aggressive", seat=0),
                chat,
                task_seed=7,
                opponent="kuhn_poker:aggressive",
            )
        )
    turns = state["turns"]
    assert len(state["episodes"]) == 3
    assert turns and all(t["kind"] == "play" and not t["invalid"] for t in turns)
    assert all(t["text"] in CHOICES and len(t["allowed"]) == len(t["response_ids"]) for t in turns)
    # The compact prompt of the last episode lists the earlier hands.
    last = turns[-1]["prompt_text"][-1]["content"]
    assert "E1:" in last and "E2:" in last and "Now E3/3" in last
    task = TaskInstance(seed=7, opponent="kuhn_poker:aggressive", seat=0)
    record = record_from_state(state, task=task, rollout=0, env_name="kuhn_poker", agent="mage")
    record = MetaEpisodeRecord.from_json(record.to_json())  # allowed sets survive JSONL
    samples = samples_from_records([record], [[0.5] * len(record.turns)])
    assert all(len(s.allowed) == len(s.response_ids) for s in samples)


def test_constrained_and_react_are_rejected() -> None:
    with pytest.raises(ValueError, match="Thought"):
        GraphOptions(react=True, context="none", constrain_actions=True)


def test_entropy_of_the_free_positions(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, seed=0) as engine:
        gens = _generate(engine, [SamplingParams(choices=CHOICES, seed=i) for i in range(8)])
    samples = [Sample(g.prompt_ids, g.response_ids, g.logprobs, 0.0, g.allowed) for g in gens]
    free = sum(len(a) > 1 for g in gens for a in g.allowed)
    tokens = sum(len(g.response_ids) for g in gens)
    assert 0 < free < tokens

    config = LearnerConfig(lr=1e-9, kl_coef=0.0, dtype="fp32", entropy_coef=1.0)
    stats = Learner(build_tiny(seed=3, init_std=0.05)[0], config).update(samples)
    # Forced positions count 0 in the token mean; the free mean leaves them out.
    assert stats["entropy_free"] == pytest.approx(stats["entropy"] * tokens / free, rel=1e-5)
    assert stats["entropy"] < 0.2 < stats["entropy_free"] <= math.log(2) + 1e-6


def test_choice_cache_keeps_only_what_succeeded_within_its_bytes(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, seed=0) as engine:
        # Choices too long for the room the prompt leaves: tokenized, refused, not kept.
        long = tuple(f"<action>{i} {'word ' * 1500}</action>" for i in range(3))
        filler = [{"role": "user", "content": "x " * 2000}]
        with pytest.raises(RequestRejected, match="longest choice"):
            _generate(engine, [SamplingParams(choices=long)], chat=filler)
        assert len(engine.choice_cache) == 0
        _generate(engine, [SamplingParams(choices=CHOICES, seed=1)])
        assert engine.choice_cache.get(CHOICES) is not None
    # Least recently used out first, and never past the byte bound.
    cache = ChoiceCache(max_bytes=200_000)
    sets = [tuple(f"<action>{k}-{i}</action>" for i in range(20)) for k in range(40)]
    for choices in sets:
        cache.put(choices, choice_token_ids(tokenizer, choices))
        assert cache.bytes <= cache.max_bytes
    assert cache.get(sets[-1]) is not None and cache.get(sets[0]) is None
    huge = tuple(f"<action>{i}</action>" for i in range(1000))
    cache.put(huge, choice_token_ids(tokenizer, huge))  # over a quarter of the bound
    assert cache.get(huge) is None


def test_a_thousand_choices_check_their_prefixes_in_n_log_n(tiny) -> None:
    _, tokenizer = tiny
    choices = [f"<action>{i:04d}</action>" for i in range(1000)]
    assert len(choice_token_ids(tokenizer, choices)) == 1000
    with pytest.raises(ValueError, match="token prefix"):
        choice_token_ids(tokenizer, [*choices, "<action>0500"])
