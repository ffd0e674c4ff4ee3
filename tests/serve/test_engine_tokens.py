"""The engine's per-token callback that streaming and ``top_logprobs`` are built on."""

from __future__ import annotations

import asyncio

import pytest

from mage_rl.policy.base import SamplingParams
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tokenization import render_prompt

CHAT = [{"role": "user", "content": "Your card is K."}]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_callback_sees_every_token_in_order_before_the_answer(tiny, temperature: float) -> None:
    model, tokenizer = tiny
    seen: list[tuple[int, float, list[tuple[int, float]]]] = []

    async def run():
        with LocalEngine(model, tokenizer, max_batch_size=4) as engine:
            prompt = render_prompt(tokenizer, CHAT)
            params = SamplingParams(temperature=temperature, max_tokens=10, seed=3)
            streamed = engine.generate_from_ids(
                prompt, params, on_token=lambda *a: seen.append(a), top_logprobs=4
            )
            plain = engine.generate_from_ids(prompt, params)  # same batch, no callback
            return await asyncio.gather(streamed, plain)

    generation, plain = asyncio.run(run())
    assert [t for t, _, _ in seen] == generation.response_ids == plain.response_ids
    assert [lp for _, lp, _ in seen] == generation.logprobs
    for token, logprob, top in seen:
        assert len(top) == 4
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert logprob <= top[0][1] + 1e-6
        if temperature == 0:
            assert top[0][0] == token


def test_negative_top_logprobs_is_refused(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer) as engine, pytest.raises(ValueError, match="top_logprobs"):
        asyncio.run(engine.generate_from_ids([1, 2, 3], top_logprobs=-1))
