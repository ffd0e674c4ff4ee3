"""The real ``openai`` client against the real server: plain, streamed, log-probs, n, stop."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import torch

from mage_rl.policy.base import SamplingParams
from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tokenization import render_prompt, special_token_ids

from .conftest import MODEL

CHAT = [
    {"role": "system", "content": "You play Kuhn Poker."},
    {"role": "user", "content": "Your card is K. <action>BET</action> or <action>PASS</action>?"},
]


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def chat(client: openai.OpenAI, **kwargs):
    kwargs.setdefault("max_tokens", 12)
    kwargs.setdefault("seed", 7)
    return client.chat.completions.create(model=MODEL, messages=CHAT, **kwargs)


def test_health_and_models(server, client) -> None:
    assert httpx.get(f"{server.root}/health").json() == {"status": "ok"}
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_completion_is_the_engine_sample(server, client) -> None:
    response = chat(client, temperature=0.8, top_p=0.9, extra_body={"return_token_ids": True})
    data = response.model_dump()
    choice = data["choices"][0]
    assert response.object == "chat.completion" and response.model == MODEL
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    prompt = render_prompt(server.engine.tokenizer, CHAT)
    assert data["prompt_token_ids"] == prompt
    ids = choice["token_ids"]
    assert response.usage.prompt_tokens == len(prompt)
    assert response.usage.completion_tokens == len(ids) <= 12
    assert response.usage.total_tokens == len(prompt) + len(ids)
    # Same seed and settings straight through the engine: the same tokens.
    direct = server.engine.generate_sync(
        CHAT, SamplingParams(temperature=0.8, top_p=0.9, max_tokens=12, seed=7)
    )
    assert ids == direct.response_ids
    assert choice["message"]["content"] == direct.text
    # And the same seed over HTTP again: reproducible.
    assert chat(client, temperature=0.8, top_p=0.9).choices[0].message.content == direct.text


def test_logprobs_are_the_sampling_logprobs(server, client) -> None:
    response = chat(client, logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    data = response.model_dump()
    content = data["choices"][0]["logprobs"]["content"]
    ids = data["choices"][0]["token_ids"]
    assert len(content) == len(ids) == response.usage.completion_tokens
    tokenizer = server.engine.tokenizer
    special = special_token_ids(tokenizer)
    for entry, token in zip(content, ids, strict=True):
        assert entry["token"] == tokenizer.decode([token])
        if "\ufffd" not in entry["token"]:
            assert bytes(entry["bytes"]) == entry["token"].encode()
        top = entry["top_logprobs"]
        assert len(top) == 3
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert entry["logprob"] <= top[0]["logprob"] + 1e-6
    # Every token's real bytes, also those of partial characters: together, the text.
    text_bytes = b"".join(
        bytes(e["bytes"]) for e, t in zip(content, ids, strict=True) if t not in special
    )
    assert text_bytes.decode(errors="replace") == data["choices"][0]["message"]["content"]
    model = server.engine.model
    with torch.no_grad():
        forced = teacher_forced_logprobs(model, data["prompt_token_ids"], ids)
    assert torch.allclose(forced, torch.tensor([e["logprob"] for e in content]), atol=1e-3)


def test_greedy_top_logprob_is_the_chosen_token(client) -> None:
    response = chat(client, temperature=0, logprobs=True, top_logprobs=1)
    for entry in response.choices[0].logprobs.content:
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)


def test_stream_matches_the_whole_response(client) -> None:
    whole = chat(client, logprobs=True, extra_body={"return_token_ids": True}).model_dump()
    chunks = list(
        chat(
            client,
            stream=True,
            logprobs=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[0].choices[0].delta.role == "assistant"
    dumped = [c.model_dump() for c in chunks]
    assert dumped[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    ids = [t for c in dumped if c["choices"] for t in c["choices"][0].get("token_ids") or []]
    assert ids == whole["choices"][0]["token_ids"]
    streamed_lp = [
        e["logprob"]
        for c in dumped
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    # The same tokens from two requests; their log-probs agree to float rounding (they
    # differed by 2e-6 once, with a training run sharing the two cores).
    whole_lp = [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    assert streamed_lp == pytest.approx(whole_lp, abs=1e-4)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [whole["choices"][0]["finish_reason"]]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)


def test_raw_stream_is_sse_ending_in_done(server) -> None:
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "seed": 1, "stream": True}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    for line in events[:-1]:
        assert json.loads(line.removeprefix("data: "))["object"] == "chat.completion.chunk"


def test_stop_string_is_cut_unless_asked_to_keep_it(client) -> None:
    free = chat(client, max_tokens=16, temperature=1.0).choices[0].message.content
    assert len(free) > 4, free
    stop = free[len(free) // 2 : len(free) // 2 + 2]
    expected = free[: free.find(stop)]
    cut = chat(client, max_tokens=16, temperature=1.0, stop=[stop]).choices[0]
    assert cut.message.content == expected and cut.finish_reason == "stop"
    kept = chat(
        client, max_tokens=16, temperature=1.0, stop=stop,
        extra_body={"include_stop_str_in_output": True},
    ).choices[0].message.content  # fmt: skip
    assert kept.startswith(expected + stop)
    streamed = chat(client, max_tokens=16, temperature=1.0, stop=[stop], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected


def test_n_choices_are_distinct_samples(client) -> None:
    response = chat(client, n=3, max_tokens=8, temperature=1.0)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert len({c.message.content for c in response.choices}) > 1
    streamed = list(chat(client, n=3, max_tokens=8, temperature=1.0, stream=True))
    texts = ["", "", ""]
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in response.choices]


def test_max_completion_tokens_limits_the_response(client) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_completion_tokens=3, seed=2
    )
    assert response.usage.completion_tokens <= 3


def test_text_completions(server, client) -> None:
    response = client.completions.create(
        model=MODEL, prompt="Your card is", max_tokens=6, seed=3, logprobs=2,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    data = response.model_dump()
    choice = data["choices"][0]
    prompt_ids = server.engine.tokenizer("Your card is", add_special_tokens=False)["input_ids"]
    assert choice["prompt_token_ids"] == prompt_ids
    assert len(choice["token_ids"]) == response.usage.completion_tokens <= 6
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(choice["token_ids"])
    assert all(len(t) == 2 for t in logprobs["top_logprobs"])
    # Token-id prompts and batches of prompts.
    batch = client.completions.create(model=MODEL, prompt=[prompt_ids, prompt_ids], max_tokens=4,
                                      n=2, seed=3)  # fmt: skip
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.usage.prompt_tokens == 2 * len(prompt_ids)
    streamed = client.completions.create(model=MODEL, prompt="Your card is", max_tokens=6, seed=3,
                                         stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == choice["text"]


def test_64_concurrent_requests_are_all_answered(server) -> None:
    stats = server.engine.stats
    requests, batches = stats.requests, stats.batches

    async def run() -> list:
        async with openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0,
                                      timeout=120) as aclient:  # fmt: skip
            return await asyncio.gather(
                *(
                    aclient.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": f"Request number {i}."}],
                        max_tokens=8,
                        seed=i,
                        extra_body={"return_token_ids": True},
                    )
                    for i in range(64)
                )
            )

    responses = asyncio.run(run())
    assert len(responses) == 64
    assert len({r.id for r in responses}) == 64
    tokenizer = server.engine.tokenizer
    for i, r in enumerate(responses):
        data = r.model_dump()
        # Each answer belongs to its own request: its prompt ids are that request's.
        expected = render_prompt(tokenizer, [{"role": "user", "content": f"Request number {i}."}])
        assert data["prompt_token_ids"] == expected
        assert 1 <= r.usage.completion_tokens <= 8
    # The requests shared forward passes: far fewer batches than requests.
    assert stats.requests - requests == 64
    assert stats.batches - batches < 64 // 2


def test_legacy_logprobs_leave_out_special_tokens_and_stay_in_the_text(server) -> None:
    tokenizer = server.engine.tokenizer
    special = special_token_ids(tokenizer)
    # Seeds 0-15 on this prompt: choice 15 ends with the EOS token, the others by length.
    body = {"model": MODEL, "prompt": "card", "max_tokens": 60, "n": 16, "seed": 0,
            "logprobs": 1, "return_token_ids": True}  # fmt: skip
    choices = httpx.post(f"{server.url}/completions", json=body, timeout=60).json()["choices"]
    ended_by_eos = [c for c in choices if c["token_ids"][-1] in special]
    assert ended_by_eos, "the test needs a choice that ends with a special token"
    for choice in choices:
        lp, text = choice["logprobs"], choice["text"]
        kept = [t for t in choice["token_ids"] if t not in special]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(kept)
        assert "<|im_end|>" not in lp["tokens"]
        assert all(0 <= off < max(len(text), 1) for off in lp["text_offset"])
        assert lp["text_offset"] == sorted(lp["text_offset"])
        assert lp["text_offset"][:1] in ([], [0])
    # Stop strings cut the text; tokens past the cut are left out, offsets stay inside.
    cut = {**body, "n": 4, "stop": ["a", "e", " "]}
    for choice in httpx.post(f"{server.url}/completions", json=cut, timeout=60).json()["choices"]:
        offsets = choice["logprobs"]["text_offset"]
        assert all(off < max(len(choice["text"]), 1) for off in offsets)
