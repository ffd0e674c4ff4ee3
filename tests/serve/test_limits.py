"""Bounded resources: body size and time, a responsive loop while tokenizing, and
cancellation of requests whose client went away."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest

from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny
from mage_rl.serve import create_app, serve_in_thread
from mage_rl.serve.launch import freeze_loaded_objects
from mage_rl.serve.limits import DEFAULT_MAX_BODY_BYTES

from .conftest import MODEL, Server

TEN_MB = "x" * (10 << 20)


class CountingServer(Server):
    renders: list[int]
    state: Any


@pytest.fixture(scope="module")
def counted(tiny) -> Iterator[CountingServer]:
    """A server with the default limits and a short body timeout, counting prompt renders."""
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, max_batch_size=32, name=MODEL) as engine:
        app = create_app(engine, MODEL, body_timeout_s=0.5)
        state = app.state.mage
        renders: list[int] = []
        render, encode = state.render, state.encode
        state.render = lambda body: renders.append(1) or render(body)
        state.encode = lambda prompt: renders.append(1) or encode(prompt)
        with serve_in_thread(app) as url:
            server = CountingServer(url, engine)
            server.renders = renders
            server.state = state
            yield server


def test_ten_mb_body_is_refused_at_once_without_tokenizing(counted) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": TEN_MB}]}
    start = time.perf_counter()
    response = httpx.post(f"{counted.url}/chat/completions", json=body, timeout=30)
    elapsed = time.perf_counter() - start
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert str(DEFAULT_MAX_BODY_BYTES) in response.json()["error"]["message"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted while reading
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"x" * (1 << 20)
        yield b'"}'

    start = time.perf_counter()
    chunked = httpx.post(f"{counted.url}/completions", content=chunks(), timeout=30)
    chunked_elapsed = time.perf_counter() - start
    assert chunked.status_code == 413
    assert counted.renders == []  # nothing was tokenized
    # Tokenizing 10 MB takes several seconds; refusing it, a moment.
    assert elapsed < 1.0 and chunked_elapsed < 2.0, (elapsed, chunked_elapsed)


def test_content_length_larger_than_the_body_times_out_instead_of_hanging(counted) -> None:
    address = urlparse(counted.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"model": "tiny"'
        )
        start = time.perf_counter()
        reply = b""
        while b"}}" not in reply and (chunk := sock.recv(65536)):
            reply += chunk
        elapsed = time.perf_counter() - start
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"request_timeout"' in reply
    assert elapsed < 5.0
    assert httpx.get(f"{counted.root}/health").status_code == 200


def test_health_answers_while_a_large_prompt_tokenizes(counted, monkeypatch) -> None:
    # About 2 MB (just under the 2 MiB limit) and 400k tokens: seconds of tokenizing,
    # then a 400 because it exceeds the context. The server refuses such a prompt from
    # its length alone; a tokenizer that gives no bound on characters per token must be
    # tokenized to know (tests/serve/test_edges.py), as here.
    monkeypatch.setattr(counted.state, "max_token_chars", None)
    content = "card bet pass king queen " * 83_000
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    result: dict[str, object] = {}

    def big() -> None:
        start = time.perf_counter()
        response = httpx.post(f"{counted.url}/chat/completions", json=body, timeout=60)
        result["status"] = response.status_code
        result["seconds"] = time.perf_counter() - start

    with httpx.Client(timeout=10) as client:
        client.get(f"{counted.root}/health")  # open the connection before timing
        thread = threading.Thread(target=big)
        thread.start()
        time.sleep(0.2)  # the body is sent and tokenizing has begun
        latencies = []
        while thread.is_alive():
            start = time.perf_counter()
            assert client.get(f"{counted.root}/health").status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.02)
        thread.join()
    assert result["status"] == 400
    assert len(latencies) >= 5, f"tokenizing took {result['seconds']:.2f}s; too short to probe"
    # Tokenizing on the event loop held /health for seconds; the bound leaves room for a
    # loaded machine (the latency itself is measured by scripts/serve_agent_fuzz.py).
    assert max(latencies) < 0.5, sorted(latencies)[-5:]


def _wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def _idle(engine: LocalEngine) -> bool:
    steps = engine.stats.steps
    time.sleep(0.2)
    return engine.stats.steps == steps


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_gives_up_stops_its_decoding(counted, stream: bool) -> None:
    engine = counted.engine
    cancelled = engine.stats.cancelled
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3000,
        "ignore_eos": True, "stream": stream,
    }  # fmt: skip

    async def give_up() -> None:
        async with httpx.AsyncClient(timeout=0.3) as client:
            if stream:  # read one event, then hang up
                async with client.stream("POST", f"{counted.url}/chat/completions", json=body) as r:
                    async for _ in r.aiter_lines():
                        break
            else:  # wait 0.3 s for the answer, then give up
                with pytest.raises(httpx.ReadTimeout):
                    await client.post(f"{counted.url}/chat/completions", json=body)

    start_steps = engine.stats.steps
    asyncio.run(give_up())
    assert _wait_for(lambda: engine.stats.cancelled == cancelled + 1, timeout=5)
    assert _wait_for(lambda: _idle(engine))
    # Far fewer decode steps than the 3,000 tokens asked for.
    assert engine.stats.steps - start_steps < 1500
    good = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    assert httpx.post(f"{counted.url}/chat/completions", json=good, timeout=30).status_code == 200


def test_a_serving_process_freezes_what_it_loaded() -> None:
    """``mage serve`` puts the model, tokenizer and graph out of the collector's reach, so
    a full collection, which stops the event loop, traverses only what requests made."""
    before = gc.get_freeze_count()
    try:
        freeze_loaded_objects()
        assert gc.get_freeze_count() > before
        gc.unfreeze()
        engine_model, tokenizer = build_tiny(seed=0)
        with LocalEngine(engine_model, tokenizer) as engine:
            with serve_in_thread(create_app(engine, "tiny")):
                assert gc.get_freeze_count() == 0  # a library caller's process is left alone
            with serve_in_thread(create_app(engine, "tiny"), freeze_loaded=True):
                assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
