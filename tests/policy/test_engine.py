"""LocalEngine on the tiny model: batching, log-prob fidelity, stops, seeds, weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mage_rl.policy.base import Generation, Policy, SamplingParams
from mage_rl.policy.engine import EngineClosedError, LocalEngine
from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tiny import build_tiny
from mage_rl.policy.tokenization import render_prompt


def chat(n_words: int, tag: str = "") -> list[dict[str, str]]:
    """A chat whose prompt length grows with ``n_words``."""
    words = " ".join(["bet", "pass", "card", "king"] * n_words)[: 6 * n_words]
    return [
        {"role": "system", "content": "You are player 0 in Kuhn Poker."},
        {"role": "user", "content": f"{tag}{words} Reply with <action>PASS</action>."},
    ]


async def gather(engine: LocalEngine, chats, params) -> list[Generation]:
    if isinstance(params, SamplingParams):
        params = [params] * len(chats)
    return await asyncio.gather(
        *(engine.generate(c, p) for c, p in zip(chats, params, strict=True))
    )


def assert_decodes_to_text(tokenizer, generation: Generation) -> None:
    # The engine's invariant: response ids decode (special tokens skipped) to the text.
    assert tokenizer.decode(generation.response_ids, skip_special_tokens=True) == generation.text


def assert_logprobs_match(model, generation: Generation, params: SamplingParams) -> float:
    with torch.no_grad():
        recomputed = teacher_forced_logprobs(
            model,
            generation.prompt_ids,
            generation.response_ids,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
        )
    recorded = torch.tensor(generation.logprobs)
    gap = (recomputed - recorded).abs().max().item()
    assert gap < 1e-3, gap
    return gap


def test_engine_is_a_policy(engine) -> None:
    assert isinstance(engine, Policy)
    assert engine.name == "tiny"


def test_concurrent_requests_share_one_batch_and_logprobs_match_teacher_forcing(
    tiny, engine
) -> None:
    model, tokenizer = tiny
    chats = [chat(n) for n in (1, 3, 6, 10, 15, 21)]  # different lengths -> left padding
    params = [SamplingParams(temperature=1.0, max_tokens=12 + 3 * i, seed=i) for i in range(6)]
    generations = asyncio.run(gather(engine, chats, params))

    # One prefill gives the first token (after one pass over the system prompt they all
    # share), then one forward pass per step for the whole batch.
    assert engine.stats.batches == 2 and engine.stats.largest_batch == 6
    assert engine.stats.forward_passes == max(len(g.response_ids) for g in generations) + 1
    assert len({len(g.prompt_ids) for g in generations}) == 6
    for generation, p in zip(generations, params, strict=True):
        assert generation.has_tokens
        assert 1 <= len(generation.response_ids) <= p.max_tokens
        assert generation.finish_reason in ("stop", "length")
        assert_decodes_to_text(tokenizer, generation)
        assert_logprobs_match(model, generation, p)


def test_truncated_sampling_logprobs_match_teacher_forcing(tiny, engine) -> None:
    model, tokenizer = tiny
    params = [
        SamplingParams(temperature=0.7, top_k=5, max_tokens=16, seed=1),
        SamplingParams(temperature=1.3, top_p=0.8, max_tokens=16, seed=2),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, max_tokens=16, seed=3),
        SamplingParams(temperature=0.0, max_tokens=16),
    ]
    generations = asyncio.run(gather(engine, [chat(n) for n in (2, 5, 8, 11)], params))
    assert engine.stats.batches == 2  # what the prompts share, then the rest of each
    for generation, p in zip(generations, params, strict=True):
        assert_decodes_to_text(tokenizer, generation)
        assert_logprobs_match(model, generation, p)
        assert all(lp <= 0.0 for lp in generation.logprobs)


def test_max_tokens_gives_length(engine) -> None:
    # Greedy on this prompt emits no EOS within 40 tokens (see the stop-string test).
    generation = engine.generate_sync(chat(4), SamplingParams(temperature=0, max_tokens=5))
    assert len(generation.response_ids) == 5
    assert generation.finish_reason == "length"


def test_stop_string_ends_response_at_the_completing_token(tiny, engine) -> None:
    _, tokenizer = tiny
    full = engine.generate_sync(chat(4), SamplingParams(temperature=0, max_tokens=40))
    assert full.finish_reason == "length"
    # Pick a stop string from the middle of the greedy text (ASCII, so byte-level
    # decoding of a token prefix is a text prefix).
    stop = next(
        full.text[i : i + 2]
        for i in range(8, len(full.text) - 2)
        if full.text[i : i + 2].isascii() and full.text[i : i + 2].strip()
    )
    stopped = engine.generate_sync(
        chat(4), SamplingParams(temperature=0, max_tokens=40, stop=("zzzz-never", stop))
    )
    assert stopped.finish_reason == "stop"
    assert stop in stopped.text
    n = len(stopped.response_ids)
    assert stopped.response_ids == full.response_ids[:n]
    # The last token completes the stop string: without it, no stop string yet.
    assert stop not in tokenizer.decode(stopped.response_ids[:-1], skip_special_tokens=True)
    assert_decodes_to_text(tokenizer, stopped)
    assert stopped.logprobs == pytest.approx(full.logprobs[:n], abs=1e-5)


def test_eos_is_in_response_ids_but_not_in_text(fresh_tiny) -> None:
    model, tokenizer = fresh_tiny
    eos = tokenizer.eos_token_id
    bias = torch.zeros(len(tokenizer))
    bias[eos] = 6.0  # EOS at a few % a step: sequences end, at different steps
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    params = [SamplingParams(max_tokens=60, seed=s) for s in range(8)]
    with LocalEngine(model, tokenizer) as engine:
        generations = asyncio.run(gather(engine, [chat(3)] * 8, params))
    ended = [g for g in generations if g.response_ids[-1] == eos]
    assert ended, "the EOS bias should end some responses"
    assert len({len(g.response_ids) for g in generations}) > 1  # rows left at different steps
    for generation in ended:
        assert generation.finish_reason == "stop"
        assert eos not in generation.response_ids[:-1]
        assert "<|im_end|>" not in generation.text
        assert_decodes_to_text(tokenizer, generation)
        assert_logprobs_match(model, generation, params[0])


def test_same_seed_same_output_alone_and_in_the_same_batch(tiny, engine) -> None:
    params = SamplingParams(max_tokens=20, seed=123)
    chats = [chat(n) for n in (2, 5, 9)]
    seeded = [SamplingParams(max_tokens=20, seed=s) for s in (1, 2, 3)]
    # Without prefix reuse the same requests run the same computation: bitwise equal.
    with LocalEngine(*tiny, max_batch_size=16, batch_wait_ms=20, prefix_cache_mb=0) as plain:
        assert plain.generate_sync(chat(5), params) == plain.generate_sync(chat(5), params)
        assert asyncio.run(gather(plain, chats, seeded)) == asyncio.run(
            gather(plain, chats, seeded)
        )
    # With it, a repeat prefills only its last token: the same draws, log-probs equal up
    # to floating-point reduction order.
    first = engine.generate_sync(chat(5), params)
    again = engine.generate_sync(chat(5), params)
    assert engine.stats.reused_tokens > 0
    assert first.response_ids == again.response_ids
    assert torch.allclose(torch.tensor(first.logprobs), torch.tensor(again.logprobs), atol=1e-5)
    # Different seeds draw differently.
    assert (
        len({tuple(g.response_ids) for g in asyncio.run(gather(engine, [chat(5)] * 3, seeded))}) > 1
    )


def test_unseeded_requests_follow_the_engine_seed(tiny) -> None:
    model, tokenizer = tiny
    outputs = []
    for _ in range(2):
        with LocalEngine(model, tokenizer, seed=5) as engine:
            outputs.append(
                [engine.generate_sync(chat(3), SamplingParams(max_tokens=10)) for _ in range(3)]
            )
    assert outputs[0] == outputs[1]
    assert outputs[0][0] != outputs[0][1]


def test_top_k_one_samples_the_greedy_tokens(tiny, engine) -> None:
    model, _ = tiny
    greedy = engine.generate_sync(chat(6), SamplingParams(temperature=0, max_tokens=25))
    top1 = engine.generate_sync(
        chat(6), SamplingParams(temperature=1.0, top_k=1, max_tokens=25, seed=9)
    )
    assert top1.response_ids == greedy.response_ids
    # Top-1 is a point mass (log-prob 0); greedy records the untempered log-prob instead.
    assert top1.logprobs == [0.0] * len(top1.logprobs)
    with torch.no_grad():
        untempered = teacher_forced_logprobs(model, greedy.prompt_ids, greedy.response_ids)
    assert greedy.logprobs == pytest.approx(untempered.tolist(), abs=1e-4)


def test_unbatched_mode_decodes_one_at_a_time_with_the_same_greedy_output(tiny, engine) -> None:
    model, tokenizer = tiny
    chats = [chat(n) for n in (1, 4, 7)]
    greedy = SamplingParams(temperature=0, max_tokens=15)
    batched = asyncio.run(gather(engine, chats, greedy))
    with LocalEngine(model, tokenizer, batched=False) as single:
        one_by_one = asyncio.run(gather(single, chats, greedy))
        assert single.stats.largest_batch == 1 and single.stats.batches == 3
    assert [g.response_ids for g in one_by_one] == [g.response_ids for g in batched]
    for a, b in zip(one_by_one, batched, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_event_loop_stays_responsive_while_decoding(engine) -> None:
    async def main() -> int:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        await gather(engine, [chat(4)] * 4, SamplingParams(max_tokens=150, seed=0))
        done.set()
        await task
        return ticks

    assert asyncio.run(main()) >= 10


def test_cancelled_request_does_not_disturb_the_batch(engine) -> None:
    async def main() -> Generation:
        doomed = asyncio.create_task(engine.generate(chat(2), SamplingParams(max_tokens=100)))
        kept = asyncio.create_task(engine.generate(chat(3), SamplingParams(max_tokens=30, seed=1)))
        await asyncio.sleep(0)
        doomed.cancel()
        return await kept

    assert len(asyncio.run(main()).response_ids) >= 1


def test_update_weights_swaps_models_and_casts_dtype() -> None:
    model_a, tokenizer = build_tiny(seed=0, dtype=torch.bfloat16)
    model_b, _ = build_tiny(seed=1)  # fp32, as a learner would hold it
    reference_b, _ = build_tiny(seed=1, dtype=torch.bfloat16)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    with LocalEngine(model_a, tokenizer) as engine, LocalEngine(reference_b, tokenizer) as ref:
        before = engine.generate_sync(chat(3), greedy)
        engine.update_weights(model_b.state_dict())
        assert engine.weight_version == 1
        assert engine.model.model.embed_tokens.weight.dtype == torch.bfloat16
        after = engine.generate_sync(chat(3), greedy)
        assert after == ref.generate_sync(chat(3), greedy)
        assert after.response_ids != before.response_ids


def test_update_weights_rejects_unknown_and_missing_names(fresh_tiny) -> None:
    model, tokenizer = fresh_tiny
    engine = LocalEngine(model, tokenizer)
    state = model.state_dict()
    with pytest.raises(KeyError, match="does not have"):
        engine.update_weights({**state, "bogus.weight": torch.zeros(1)})
    partial = {k: v for k, v in state.items() if "layers.0." not in k}
    with pytest.raises(KeyError, match="missing"):
        engine.update_weights(partial)
    engine.update_weights(partial, strict=False)
    assert engine.weight_version == 1


def test_generate_sync_works_inside_a_running_loop(engine) -> None:
    async def main() -> Generation:
        return engine.generate_sync(chat(2), SamplingParams(max_tokens=4, seed=0))

    assert len(asyncio.run(main()).response_ids) >= 1


def test_prompt_longer_than_context_is_rejected(tiny) -> None:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer) as engine:
        engine.max_context = 16
        with pytest.raises(ValueError, match="context"):
            engine.generate_sync(chat(10))


def test_closed_engine_refuses_requests(tiny) -> None:
    model, tokenizer = tiny
    engine = LocalEngine(model, tokenizer)
    engine.generate_sync(chat(1), SamplingParams(max_tokens=2))
    engine.close()
    with pytest.raises(EngineClosedError):
        engine.generate_sync(chat(1))


def test_late_requests_join_the_running_batch_with_exact_logprobs(tiny, engine) -> None:
    model, tokenizer = tiny
    long = SamplingParams(temperature=1.0, max_tokens=400, seed=0)
    late = [SamplingParams(temperature=0.8, top_k=7, max_tokens=6 + i, seed=i) for i in range(3)]

    async def main() -> list[Generation]:
        decoding = asyncio.Event()
        drawn: list[int] = []

        def on_token(token: int, _logprob: float, _top: list) -> None:
            drawn.append(token)
            if len(drawn) == 20:
                decoding.set()

        first = asyncio.create_task(
            engine.generate_from_ids(
                render_prompt(tokenizer, chat(2)), long, on_token=on_token, ignore_eos=True
            )
        )
        await decoding.wait()  # the long request is 20 tokens into its decode loop
        # Prompts longer (20) and shorter (1) than the running cache: both get padded.
        joined = await asyncio.gather(
            *(engine.generate(chat(n), p) for n, p in zip((20, 1, 9), late, strict=True))
        )
        assert not first.done(), "the late requests must finish while the long one decodes"
        assert len(drawn) < 400
        return [await first, *joined]

    generations = asyncio.run(main())
    assert engine.stats.batches >= 2 and engine.stats.largest_batch >= 2
    assert len(generations[0].response_ids) == 400  # ignore_eos: decoded to max_tokens
    for generation, p in zip(generations, [long, *late], strict=True):
        # Rows merged into a running cache (left-padded to its length) see exactly what
        # they would see alone.
        assert_logprobs_match(model, generation, p)
        assert_decodes_to_text(tokenizer, generation)


def test_seeded_request_gives_the_same_tokens_alone_and_joining_a_batch(engine) -> None:
    params = SamplingParams(max_tokens=12, seed=77)
    alone = engine.generate_sync(chat(3), params)

    async def main() -> Generation:
        busy = asyncio.create_task(engine.generate(chat(8), SamplingParams(max_tokens=80, seed=1)))
        await asyncio.sleep(0.1)
        joined = await engine.generate(chat(3), params)
        await busy
        return joined

    assert asyncio.run(main()).response_ids == alone.response_ids


def test_a_request_whose_sampling_fails_fails_alone(engine) -> None:
    async def main() -> list[Generation | BaseException]:
        good = [SamplingParams(max_tokens=8, seed=i) for i in range(5)]
        # 1e-38 overflows the scaled logits to inf: that row's distribution is NaN.
        bad = [
            SamplingParams(temperature=1e-38, max_tokens=8),
            SamplingParams(top_k=2**63, max_tokens=8, seed=0),
        ]
        return await asyncio.gather(
            *(engine.generate(chat(3), p) for p in [*good[:3], bad[0], *good[3:], bad[1]]),
            return_exceptions=True,
        )

    outcomes = asyncio.run(main())
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert (
        len(failed) == 1 and isinstance(failed[0], ValueError) and "temperature" in str(failed[0])
    )
    assert outcomes.index(failed[0]) == 3
    # A top_k beyond the vocabulary keeps every token, like 0.
    assert all(isinstance(o, Generation) and o.has_tokens for i, o in enumerate(outcomes) if i != 3)
    assert engine.stats.failed == 1


def test_cancelled_request_leaves_the_batch_at_the_next_step(tiny, engine) -> None:
    _, tokenizer = tiny
    drawn: list[int] = []

    async def main() -> None:
        five = asyncio.Event()

        def on_token(token: int, _logprob: float, _top: list) -> None:
            drawn.append(token)
            if len(drawn) == 5:
                five.set()

        doomed = asyncio.create_task(
            engine.generate_from_ids(
                render_prompt(tokenizer, chat(2)), SamplingParams(max_tokens=3000, seed=0),
                on_token=on_token, ignore_eos=True,
            )
        )  # fmt: skip
        await five.wait()
        doomed.cancel()
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert engine.stats.cancelled == 1
    # Tokens already drawn when the cancellation reached the worker, then nothing more.
    assert len(drawn) < 100 and engine.stats.generated_tokens == len(drawn)


def test_update_weights_waits_for_the_running_batch(fresh_tiny) -> None:
    model, tokenizer = fresh_tiny
    other, _ = build_tiny(seed=3)
    with LocalEngine(model, tokenizer) as engine:

        async def main() -> tuple[Generation, Generation]:
            running = asyncio.create_task(
                engine.generate(chat(2), SamplingParams(temperature=0, max_tokens=150))
            )
            await asyncio.sleep(0.1)
            update = asyncio.create_task(
                asyncio.to_thread(engine.update_weights, other.state_dict())
            )
            await asyncio.sleep(0.05)
            later = asyncio.create_task(
                engine.generate(chat(2), SamplingParams(temperature=0, max_tokens=150))
            )
            await update
            return await running, await later

        old, new = asyncio.run(main())
    reference, _ = build_tiny(seed=0)
    with LocalEngine(reference, tokenizer) as ref_engine:
        assert old == ref_engine.generate_sync(
            chat(2), SamplingParams(temperature=0, max_tokens=150)
        )
    with LocalEngine(other, tokenizer) as ref_engine:
        assert new == ref_engine.generate_sync(
            chat(2), SamplingParams(temperature=0, max_tokens=150)
        )
