"""Prefix reuse and chunked prefill in LocalEngine: exactness, ordering, memory bounds."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mage_rl.policy.base import Generation, SamplingParams
from mage_rl.policy.decoding import shared_prefixes
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.prefix_cache import PrefixCache
from mage_rl.policy.requests import DecodeRequest
from mage_rl.policy.tokenization import render_prompt

from .test_engine import assert_logprobs_match, chat


def run_in_order(engine: LocalEngine, prompts: list[list[int]], params: list[SamplingParams]):
    """Send the prompts one after another (each after the previous one is answered)."""

    async def main() -> list[Generation]:
        return [await engine.generate_from_ids(p, q) for p, q in zip(prompts, params, strict=True)]

    return asyncio.run(main())


def assert_same_samples(a: list[Generation], b: list[Generation]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.response_ids == y.response_ids
        gap = max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True))
        assert gap < 1e-4, gap


def test_shared_prefixes_are_reused_with_the_same_samples(tiny) -> None:
    model, tokenizer = tiny
    prompts = [render_prompt(tokenizer, chat(n, tag=f"{n}: ")) for n in (12, 12, 30, 5)]
    params = [SamplingParams(temperature=1.0, top_k=9, max_tokens=10, seed=i) for i in range(4)]
    with (
        LocalEngine(model, tokenizer) as reusing,
        LocalEngine(model, tokenizer, prefix_cache_mb=0) as plain,
    ):
        reused = run_in_order(reusing, prompts, params)
        fresh = run_in_order(plain, prompts, params)
        assert plain.stats.reused_tokens == 0 and plain.prefix_cache is None
        # The system prompt is shared by all; the second prompt is the first one again.
        assert reusing.stats.reused_tokens >= len(prompts[1]) - 1 + 3 * 10
        assert reusing.stats.prompt_tokens + reusing.stats.reused_tokens == sum(map(len, prompts))
    assert_same_samples(reused, fresh)
    for generation, p in zip(reused, params, strict=True):
        assert_logprobs_match(model, generation, p)


@pytest.mark.parametrize("prefill_tokens", [4096, 64])
def test_requests_that_arrive_together_prefill_what_they_share_once(
    tiny, prefill_tokens: int
) -> None:
    """With nothing decoding, the shared pass may exceed the prefill budget."""
    model, tokenizer = tiny
    # Three share a long prompt up to their last words; a fourth shares the system prompt.
    prompts = [render_prompt(tokenizer, chat(40, tag=t)) for t in ("", "", "")]
    prompts = [p[:-4] + [p[-4] + k] + p[-3:] for k, p in enumerate(prompts)]
    prompts.append(render_prompt(tokenizer, chat(3)))
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(4)]
    with LocalEngine(model, tokenizer, batch_wait_ms=200, prefill_tokens=prefill_tokens) as sharing:
        together = asyncio.run(_gather(sharing, prompts, params))
        stats = sharing.stats
    with LocalEngine(model, tokenizer, prefix_cache_mb=0, batch_wait_ms=200) as plain:
        alone = asyncio.run(_gather(plain, prompts, params))
        assert plain.stats.prompt_tokens == sum(map(len, prompts))
    # The three long prompts' common part went through one forward pass, not three.
    common = len(prompts[0]) - 4
    assert stats.prompt_tokens + stats.reused_tokens == sum(map(len, prompts))
    assert stats.reused_tokens >= 2 * common
    assert stats.forward_passes > plain.stats.forward_passes  # the shared pass
    assert_same_samples(together, alone)
    for generation, p in zip(together, params, strict=True):
        assert_logprobs_match(model, generation, p)


def test_arrivals_are_grouped_where_sharing_saves_prefill() -> None:
    def request(ids: list[int], reused: int = 0) -> DecodeRequest:
        return DecodeRequest(ids, SamplingParams(), torch.Generator(), 8, print, prefix_len=reused)

    system = list(range(100, 130))
    a = [request(system + [1] * 20 + [k]) for k in range(3)]  # 50 tokens in common
    b = [request(system + [2] * 20 + [k]) for k in range(2)]  # 50 in common, 30 with a
    lone = request([7] * 40)
    groups = shared_prefixes([b[0], lone, a[1], a[0], b[1], a[2]], min_tokens=8)
    got = sorted((sorted(id(r) for r in g), n) for g, n in groups)
    assert got == sorted([(sorted(map(id, a)), 50), (sorted(map(id, b)), 50)])
    # What every member reuses already is not worth a pass of its own.
    cached = [request(system + [1] * 20 + [k], reused=45) for k in range(3)]
    assert shared_prefixes(cached, min_tokens=8) == []
    # Two requests with the same prompt share all of it but the last token.
    same = [request(system), request(list(system))]
    assert [n for _, n in shared_prefixes(same, min_tokens=8)] == [len(system) - 1]


def test_a_conversation_prefills_only_its_new_turn(tiny) -> None:
    model, tokenizer = tiny
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
    with LocalEngine(model, tokenizer) as engine:
        first = engine.generate_sync(chat(8), params)
        # The next call appends to the exact ids of the first (the conversation layout).
        follow = first.prompt_ids + first.response_ids + render_prompt(tokenizer, chat(1))[1:]
        before = engine.stats.prompt_tokens
        second = run_in_order(engine, [follow], [params])[0]
        # Every id of the first call had its keys and values computed but the last
        # sampled one, which never went through a forward pass.
        new_tokens = len(follow) - (len(first.prompt_ids) + len(first.response_ids) - 1)
        assert engine.stats.prompt_tokens - before == new_tokens
    with LocalEngine(model, tokenizer, prefix_cache_mb=0) as plain:
        assert_same_samples([second], [run_in_order(plain, [follow], [params])[0]])


def test_chunked_prefill_samples_what_one_shot_prefill_samples(tiny) -> None:
    model, tokenizer = tiny
    prompts = [render_prompt(tokenizer, chat(n)) for n in (60, 3, 45)]
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=i) for i in range(3)]

    def sample(prefill_tokens: int) -> tuple[list[Generation], int]:
        with LocalEngine(
            model, tokenizer, prefill_tokens=prefill_tokens, prefix_cache_mb=0, batch_wait_ms=50
        ) as engine:
            gens = asyncio.run(_gather(engine, prompts, params))
            return gens, engine.stats.batches

    chunked, passes = sample(16)
    whole, one = sample(4096)
    assert one == 1
    # 107 + 36 + 92 tokens in passes of at most 16: at least 15 of them.
    assert passes >= -(-sum(map(len, prompts)) // 16)
    assert_same_samples(chunked, whole)
    for generation, p in zip(chunked, params, strict=True):
        assert_logprobs_match(model, generation, p)


def test_a_short_request_finishes_while_a_long_prompt_is_prefilled(tiny) -> None:
    model, tokenizer = tiny
    long_prompt = render_prompt(tokenizer, chat(300))  # ~400 tokens: 50 chunks of 8
    short_prompt = [1, 714, 201, 635, 290, 67]
    events: list[str] = []

    async def main() -> tuple[Generation, Generation]:
        long = asyncio.create_task(
            engine.generate_from_ids(
                long_prompt, SamplingParams(max_tokens=2, seed=0),
                on_token=lambda *_: events.append("long token"),
            )
        )  # fmt: skip
        await asyncio.sleep(0)  # the long request is queued first
        short = await engine.generate_from_ids(short_prompt, SamplingParams(max_tokens=3, seed=1))
        events.append("short answered")
        return await long, short

    with LocalEngine(model, tokenizer, prefill_tokens=16, prefix_cache_mb=0) as engine:
        long, short = asyncio.run(main())
        chunks = engine.stats.batches
    assert len(short.response_ids) == 3 and len(long.response_ids) == 2
    # The short request was prefilled beside the long prompt's chunks and answered before
    # the long one drew its first token.
    assert events.index("short answered") < events.index("long token")
    # The long prompt gets at least half of every step's 16 tokens.
    assert chunks >= len(long_prompt) // 16
    assert chunks <= -(-len(long_prompt) // 8) + 1


def test_prefix_cache_stays_within_its_memory_bound() -> None:
    def states(n: int) -> list:
        return [(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4))]  # 64 bytes per token

    cache = PrefixCache(max_bytes=64 * 100, min_tokens=4)
    assert cache.store(list(range(40)), states(40))
    assert not cache.store(list(range(30)), states(30))  # covered by the first
    assert cache.store(list(range(40)) + [7] * 20, states(60))  # extends it: replaces it
    assert len(cache) == 1 and cache.nbytes == 64 * 60
    assert cache.store([9] * 30, states(30))
    assert cache.store([8] * 30, states(30))  # 120 tokens > 100: the oldest goes
    assert len(cache) == 2 and cache.nbytes == 64 * 60 and cache.stats.evicted == 1
    assert not cache.store([5] * 200, states(200))  # alone over the bound
    reused, layers = cache.lookup([8] * 10 + [1])
    assert reused == 10 and layers is not None and layers[0][0].shape[2] == 10
    assert cache.lookup([8] * 3 + [1]) == (0, None)  # shorter than min_tokens
    assert cache.lookup([8] * 30)[0] == 29  # the last prompt token is always prefilled
    cache.clear()
    assert len(cache) == 0 and cache.lookup([8] * 30) == (0, None)


def test_new_weights_clear_the_prefix_cache(fresh_tiny) -> None:
    model, tokenizer = fresh_tiny
    with LocalEngine(model, tokenizer) as engine:
        engine.generate_sync(chat(5), SamplingParams(max_tokens=4, seed=0))
        assert engine.prefix_cache is not None and len(engine.prefix_cache) == 1
        engine.update_weights(model.state_dict())
        assert len(engine.prefix_cache) == 0


def test_bad_prefill_settings_are_refused(tiny) -> None:
    with pytest.raises(ValueError, match="prefill_tokens"):
        LocalEngine(*tiny, prefill_tokens=0)
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        LocalEngine(*tiny, prefix_cache_mb=-1)


async def _gather(engine: LocalEngine, prompts, params) -> list[Generation]:
    return await asyncio.gather(
        *(engine.generate_from_ids(p, q) for p, q in zip(prompts, params, strict=True))
    )
