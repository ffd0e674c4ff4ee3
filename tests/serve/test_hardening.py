"""Bad requests cannot hurt the server or the requests beside them.

A fuzz run sends hundreds of generated bad requests through the real HTTP server (raw
HTTP, and the ``openai`` client where it can express them); then 15 good requests go out
together with one bad request of each class, and all 15 must succeed.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator

import httpx
import openai
import pytest

from mage_rl.policy.engine import LocalEngine
from mage_rl.serve import create_app, serve_in_thread

from .conftest import MODEL, Server

GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
GOOD_COMPLETION = {"model": MODEL, "prompt": "card", "max_tokens": 4}
BODY_LIMIT = 256 << 10

# Values that must never cause a 5xx, by sampling field. Some are valid (a tiny top_p keeps
# the most likely token; a top_k beyond the vocabulary keeps all): those must be served.
BAD_VALUES: dict[str, list[object]] = {
    "temperature": [1e-38, 1e-300, 5e-324, 1e-3, -1, -0.0, 2.0001, 1e308, True, "1", None, [], {}],
    "top_p": [1e-300, 5e-324, 0, -0.5, 1.5, True, "0.5", [0.5]],
    "top_k": [2**63, 2**63 - 1, 2**64, -(2**63), -2, 10**30, True, "5", 1.5],
    "seed": [2**63, 2**64, -(2**63) - 1, 10**40, True, "7", 1.0],
    "max_tokens": [0, -1, 2**63, 2**64, True, "4", 4.5],
    "n": [0, 17, 2**63, True, "2"],
    "stream": ["true", 1, "1", 0, None],
    "logprobs": ["true", 1],
    "top_logprobs": [21, -1, True, "3"],
    "stop": [["a"] * 5, [""], "", 5, [5], ["\ud800"]],
    "presence_penalty": [1e308, float("inf"), "x"],
    "logit_bias": [{"5": 100}, "x"],
}
BAD_MESSAGES: list[object] = [
    [], "hi", [{"role": "bot", "content": "x"}], [{"content": "x"}], [{"role": "user"} ] * 0,
    [{"role": "user", "content": 5}], [{"role": "user", "content": [{"type": "image_url"}]}],
    [{"role": "user", "content": [{"type": "text", "text": 5}]}],
    [{"role": "user", "content": "\ud800 lone"}], [{"role": "user", "content": "\udfff"}],
    [{"role": True, "content": "x"}], [None], [[{"role": "user", "content": "x"}]],
]  # fmt: skip
BAD_PROMPTS: list[object] = [
    "\ud800", ["ok", "\udc00"], [10**9], [-1], [2**63], [True, 5], [[]], [], [[1, 2], "x"],
    [1.5], {"a": 1}, None, "",
]  # fmt: skip


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _raw_bodies(rng: random.Random) -> list[bytes]:
    good = json.dumps(GOOD).encode()
    bodies = [good[: rng.randrange(1, len(good))] for _ in range(20)]  # truncated JSON
    bodies += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(20)]
    bodies += [
        b"[1, 2]", b"null", b"42", b'"x"', b"", b"{", b"\xff\xfe", b"NaN",
        json.dumps({**GOOD, "x": json.loads(_nested(40))}).encode(),
        good[:-1] + b', "stream_options": ' + _nested(1500).encode() + b"}",
        good[:-1] + b', "tool_choice": ' + _nested(100_000).encode() + b"}",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00\\ud800"}]}',
        b'{"model": "tiny", "temperature": 1e999, "messages": [{"role": "user", "content": "x"}]}',
        b'{"model": "tiny", "seed": 99999999999999999999999999, "messages": []}',
        b"{" + b'"a":1,' * 1000 + b'"model": "tiny"}',
    ]  # fmt: skip
    return bodies


def _bad_requests(seed: int = 0) -> list[tuple[str, bytes]]:
    """(path, body) pairs: every class, values drawn and combined at random."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes]] = []

    def add(path: str, body: object) -> None:
        out.append((path, json.dumps(body).encode()))

    for field, values in BAD_VALUES.items():
        for value in values:
            add("/chat/completions", {**GOOD, field: value})
            add("/completions", {**GOOD_COMPLETION, field: value})
            add("/chat/completions", {**GOOD, field: value, "stream": True})
    for messages in BAD_MESSAGES:
        add("/chat/completions", {**GOOD, "messages": messages})
    for prompt in BAD_PROMPTS:
        add("/completions", {**GOOD_COMPLETION, "prompt": prompt})
        add("/completions", {**GOOD_COMPLETION, "prompt": prompt, "stream": True})
    for _ in range(150):  # two or three bad fields at once
        body: dict[str, object] = dict(GOOD)
        for field in rng.sample(sorted(BAD_VALUES), rng.randrange(2, 4)):
            body[field] = rng.choice(BAD_VALUES[field])
        add(rng.choice(["/chat/completions", "/completions"]), body)
    for _ in range(30):  # deep nesting in a random field
        depth = rng.choice([33, 100, 999, 1001, 5000])
        body_bytes = (
            json.dumps(GOOD).encode()[:-1] + b', "extra": ' + _nested(depth).encode() + b"}"
        )
        out.append(("/chat/completions", body_bytes))
    out += [("/chat/completions", b) for b in _raw_bodies(rng)]
    out += [("/completions", b) for b in _raw_bodies(rng)[:20]]
    many = {**GOOD, "messages": [{"role": "user", "content": "x"}] * 4097}
    out += [("/chat/completions", json.dumps(many).encode())] * 3
    out += [("/completions", json.dumps({**GOOD_COMPLETION, "prompt": ["x"] * 257}).encode())]
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 1)}]}
    out += [("/chat/completions", json.dumps(big).encode())] * 5
    return out


def test_the_generator_makes_enough_bad_requests() -> None:
    assert len(_bad_requests()) >= 500


@pytest.fixture(scope="module")
def limited_server(tiny) -> Iterator[Server]:
    model, tokenizer = tiny
    with (
        LocalEngine(model, tokenizer, max_batch_size=64, batch_wait_ms=5, name=MODEL) as engine,
        serve_in_thread(create_app(engine, MODEL, max_body_bytes=BODY_LIMIT, body_timeout_s=1.0))
        as url,
    ):  # fmt: skip
        yield Server(url, engine)


def _assert_openai_error(response: httpx.Response) -> None:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]


def _assert_good_reply(response: httpx.Response) -> None:
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        for event in events[:-1]:
            data = json.loads(event.removeprefix("data: "))
            if "error" in data:  # an in-band error is OpenAI-shaped and not a server fault
                assert data["error"]["type"] != "server_error", data
            else:
                assert "choices" in data
        return
    assert response.json()["choices"], response.text


def test_fuzz_bad_requests_get_4xx_json_and_the_server_stays_healthy(limited_server) -> None:
    requests = _bad_requests()

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            gate = asyncio.Semaphore(16)

            async def send(path: str, body: bytes) -> httpx.Response:
                async with gate:
                    return await client.post(
                        f"{limited_server.url}{path}",
                        content=body,
                        headers={"content-type": "application/json"},
                    )

            return await asyncio.gather(*(send(p, b) for p, b in requests))

    responses = asyncio.run(run())
    statuses = [r.status_code for r in responses]
    assert max(statuses) < 500, [
        (r.status_code, r.text[:200]) for r in responses if r.status_code >= 500
    ]
    for response in responses:
        if response.status_code >= 400:
            _assert_openai_error(response)
        else:
            _assert_good_reply(response)
    assert statuses.count(413) >= 5 and statuses.count(400) >= 400
    assert httpx.get(f"{limited_server.root}/health").json() == {"status": "ok"}
    good = httpx.post(f"{limited_server.url}/chat/completions", json=GOOD, timeout=60)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["role"] == "assistant"


def test_openai_client_gets_bad_request_errors(limited_server) -> None:
    client = openai.OpenAI(base_url=limited_server.url, api_key="x", max_retries=0)
    messages = GOOD["messages"]
    for extra in ({"top_k": 2**63}, {"seed": 2**64}, {"temperature": 1e-38}, {"n": True}):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra)
    with pytest.raises(openai.BadRequestError, match="seed"):
        client.completions.create(model=MODEL, prompt="card", seed=-(2**63) - 1)
    with pytest.raises(openai.BadRequestError):
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, extra_body={"top_k": 2**63}
        )
        list(stream)
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    assert reply.choices[0].message.role == "assistant"


# One bad request of each class the review found, sent with 15 good ones.
ISOLATION_CLASSES: dict[str, tuple[str, object]] = {
    "top_k 2**63": ("/chat/completions", {**GOOD, "top_k": 2**63}),
    "temperature 1e-38": ("/chat/completions", {**GOOD, "temperature": 1e-38}),
    "top_p 1e-300": ("/chat/completions", {**GOOD, "top_p": 1e-300, "max_tokens": 8}),
    "top_k 2**63 streamed": ("/chat/completions", {**GOOD, "top_k": 2**63, "stream": True}),
    "seed 2**64": ("/chat/completions", {**GOOD, "seed": 2**64}),
    "nested 1,500 levels": ("/chat/completions", _nested(1500)),
    "lone surrogate prompt": ("/completions", {**GOOD_COMPLETION, "prompt": "\ud800"}),
    "stream as a string": ("/chat/completions", {**GOOD, "stream": "1"}),
    "oversized body": ("/chat/completions", {**GOOD, "pad": "x" * (BODY_LIMIT + 1)}),
}


@pytest.mark.parametrize("name", list(ISOLATION_CLASSES))
def test_fifteen_good_requests_beside_a_bad_one_all_succeed(limited_server, name: str) -> None:
    path, bad = ISOLATION_CLASSES[name]
    bad_body = bad.encode() if isinstance(bad, str) else json.dumps(bad).encode()

    async def run() -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            good = [
                client.post(
                    f"{limited_server.url}/chat/completions",
                    json={**GOOD, "max_tokens": 12, "seed": i, "stream": i % 3 == 0},
                )
                for i in range(15)
            ]
            bad_call = client.post(
                f"{limited_server.url}{path}",
                content=bad_body,
                headers={"content-type": "application/json"},
            )
            *answers, bad_answer = await asyncio.gather(*good, bad_call)
            return answers, bad_answer

    answers, bad_answer = asyncio.run(run())
    assert bad_answer.status_code < 500
    for answer in answers:
        assert answer.status_code == 200, answer.text
        _assert_good_reply(answer)
        if not answer.headers["content-type"].startswith("text/event-stream"):
            assert answer.json()["choices"][0]["finish_reason"] in ("stop", "length")
