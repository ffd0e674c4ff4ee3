"""Decoding over preallocated buffers (``static_decode="eager"``) against the growing cache.

The CUDA-graph mode replays the same step over the same buffers; it runs in
``tests/test_cuda.py`` on a GPU.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from mage_rl.policy.base import Generation, SamplingParams
from mage_rl.policy.decoding import RunningBatch
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.requests import DecodeRequest, DecodeStats
from mage_rl.policy.static_decode import BLOCK, resolve_static_decode
from mage_rl.policy.tokenization import render_prompt

from .test_engine import assert_logprobs_match, chat

PROMPTS = [[5 + (7 * i + j) % 200 for j in range(4 + 3 * i)] for i in range(6)]  # ragged


def decode(tiny, mode: str, params: list[SamplingParams]) -> tuple[list[Generation], DecodeStats]:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, max_batch_size=8, batch_wait_ms=50, static_decode=mode) as e:

        async def main() -> list[Generation]:
            calls = (
                e.generate_from_ids(p, s, ignore_eos=True)
                for p, s in zip(PROMPTS, params, strict=True)
            )
            return await asyncio.gather(*calls)

        return asyncio.run(main()), e.stats


def test_greedy_tokens_and_logprobs_equal_the_growing_cache(tiny) -> None:
    # Rows leave one by one (different lengths) and the longest outgrows the first
    # buffers' columns, so the cache is copied in again and the buffers grow.
    params = [SamplingParams(max_tokens=20 + 45 * i, temperature=0.0) for i in range(6)]
    growing, _ = decode(tiny, "off", params)
    static, stats = decode(tiny, "eager", params)
    assert max(len(p) for p in PROMPTS) + 20 + 45 * 5 > 2 * BLOCK
    for a, b in zip(growing, static, strict=True):
        assert a.response_ids == b.response_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    # One copy per change of the batch (5 rows leave) plus at least one growth.
    assert 6 <= stats.static_copies <= 6 + 3
    assert stats.graph_captures == stats.graph_steps == stats.graph_failures == 0


def test_sampled_logprobs_match_teacher_forcing(tiny) -> None:
    params = [SamplingParams(max_tokens=30, temperature=1.0, top_k=9, seed=i) for i in range(6)]
    generations, _ = decode(tiny, "eager", params)
    for generation, p in zip(generations, params, strict=True):
        assert len(generation.response_ids) == 30
        assert_logprobs_match(tiny[0], generation, p)


def test_late_requests_join_and_a_conversation_reuses_the_stored_prefix(tiny) -> None:
    model, tokenizer = tiny
    long = SamplingParams(temperature=1.0, max_tokens=150, seed=0)
    late = [SamplingParams(temperature=0.8, max_tokens=6 + i, seed=i) for i in range(3)]
    with LocalEngine(model, tokenizer, max_batch_size=8, static_decode="eager") as engine:

        async def main() -> list[Generation]:
            started = asyncio.Event()
            drawn: list[int] = []

            def on_token(token: int, _logprob: float, _top: list) -> None:
                drawn.append(token)
                if len(drawn) == 10:
                    started.set()

            first = asyncio.create_task(
                engine.generate_from_ids(
                    render_prompt(tokenizer, chat(2)), long, on_token=on_token, ignore_eos=True
                )
            )
            await started.wait()
            joined = await asyncio.gather(
                *(engine.generate(chat(n), p) for n, p in zip((20, 1, 9), late, strict=True))
            )
            return [await first, *joined]

        generations = asyncio.run(main())
        # The finished rows' states were stored from views of the buffers: a longer
        # prompt that starts with a finished sequence reuses it, and is still exact.
        again = SamplingParams(temperature=1.0, max_tokens=5, seed=9)
        follow = generations[1].prompt_ids + generations[1].response_ids + [5, 6, 7]
        reused_before = engine.stats.reused_tokens
        continued = asyncio.run(engine.generate_from_ids(follow, again))
        assert engine.stats.reused_tokens > reused_before
    for generation, p in zip([*generations, continued], [long, *late, again], strict=True):
        assert_logprobs_match(model, generation, p)
    assert engine.stats.static_copies >= 2


def test_the_cache_layers_are_views_of_the_buffers(tiny) -> None:
    model, tokenizer = tiny
    stats = DecodeStats()
    batch = RunningBatch(
        model, tokenizer, pad_id=0, eos_ids={1}, stats=stats, static_decode="eager"
    )
    assert batch.static is not None
    results: list[object] = []
    request = DecodeRequest(
        prompt_ids=PROMPTS[3], params=SamplingParams(max_tokens=5, temperature=0.0),
        generator=torch.Generator().manual_seed(0), max_new_tokens=5, resolve=results.append,
        ignore_eos=True,
    )  # fmt: skip
    batch.admit([request])
    batch.step()  # prefill, first token, one decode step
    batch.step()
    static = batch.static
    assert batch.cache is not None
    for layer, buffer in zip(batch.cache.layers, static._layers, strict=True):
        assert layer.keys.data_ptr() == buffer.keys.data_ptr()
        assert layer.keys.shape[-2] == batch.mask.shape[1] == len(PROMPTS[3]) + 2
    assert stats.static_copies == 1
    while batch:
        batch.step()
    assert len(results) == 1 and len(results[0].response_ids) == 5  # type: ignore[attr-defined]


def test_modes_are_checked() -> None:
    assert resolve_static_decode("auto", torch.device("cpu")) == "off"
    assert resolve_static_decode("auto", torch.device("cuda")) == "graphs"
    with pytest.raises(ValueError, match="static_decode must be one of"):
        resolve_static_decode("fast", torch.device("cpu"))


def test_graphs_need_a_cuda_device(tiny) -> None:
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        RunningBatch(
            model, tokenizer, pad_id=0, eos_ids={1}, stats=DecodeStats(), static_decode="graphs"
        )
