"""The last edges of the server: prompts far over the context refused from their length,
slow headers, streams cut by the drain limit, keys clients cannot send, and the messages
of a few malformed requests. Real uvicorn servers, driven by the ``openai`` client where
a client would see the answer."""

from __future__ import annotations

import json
import random
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import openai
import psutil
import pytest

from mage_rl.cli import build_parser, main
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tokenization import max_chars_per_token
from mage_rl.serve import create_app, serve_in_thread
from mage_rl.serve.launch import resolve_api_key
from mage_rl.serve.limits import check_api_key, check_key
from mage_rl.serve.protocol import APIError

from .conftest import MODEL, Server

HI = [{"role": "user", "content": "Hi"}]
NEAR_LIMIT = ("card bet pass king queen " * 76_000)[:1_900_000]  # 1.9 MB, ~330k tokens


@pytest.fixture(scope="module")
def quick(tiny) -> Iterator[Server]:
    """A server whose header timeout is 1 s."""
    model, tokenizer = tiny
    with (
        LocalEngine(model, tokenizer, max_batch_size=32, name=MODEL) as engine,
        serve_in_thread(create_app(engine, MODEL), header_timeout_s=1.0) as url,
    ):
        yield Server(url, engine)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


# -- prompts far over the context ----------------------------------------------------------


def test_the_tokenizer_bound_holds_for_the_tiny_model(tiny) -> None:
    _, tokenizer = tiny
    bound = max_chars_per_token(tokenizer)
    assert bound == 22  # its longest piece, 'Ġ+-*/=()[]{}<>.,:;!?\'"'
    rng = random.Random(0)
    alphabet = list("abc xyz+-*/=()[]{}<>.,:;!?'\"\n\t") + ["é", "ß", "漢", "🙂", "<|im_start|>"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 400)))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) >= -(-len(text) // bound), text
    longest = "".join(max(tokenizer.get_vocab(), key=len).replace("Ġ", " ")) * 50
    assert len(tokenizer(longest, add_special_tokens=False)["input_ids"]) >= len(longest) / bound


def test_tokenizers_that_can_drop_text_get_no_bound() -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "a": 1, "b": 2, "##b": 3}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    assert max_chars_per_token(PreTrainedTokenizerFast(tokenizer_object=wordpiece)) is None
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    assert max_chars_per_token(PreTrainedTokenizerFast(tokenizer_object=bpe)) == 2
    bpe.normalizer = normalizers.NFC()
    assert max_chars_per_token(PreTrainedTokenizerFast(tokenizer_object=bpe)) == 8
    bpe.normalizer = normalizers.Strip()
    assert max_chars_per_token(PreTrainedTokenizerFast(tokenizer_object=bpe)) is None


def test_36_prompts_of_1_9_mb_are_refused_at_once_and_leave_no_memory(server) -> None:
    """Tokenizing one took 0.7-1.8 s and kept 100-170 MB; the length alone refuses it."""
    process = psutil.Process()
    client = _client(server)
    messages = [{"role": "user", "content": NEAR_LIMIT}]
    client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)  # warm

    def refused(_: int) -> float:
        start = time.perf_counter()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        assert info.value.code == "context_length_exceeded"
        assert info.value.param == "messages"
        return time.perf_counter() - start

    health: list[float] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=10) as probe_client:
            while not done.is_set():
                start = time.perf_counter()
                assert probe_client.get(f"{server.root}/health").status_code == 200
                health.append(time.perf_counter() - start)
                time.sleep(0.02)

    before = process.memory_info().rss
    prober = threading.Thread(target=probe)
    prober.start()
    with ThreadPoolExecutor(4) as pool:
        seconds = list(pool.map(refused, range(36)))
    done.set()
    prober.join()
    time.sleep(0.5)  # the server hands freed memory back shortly after large requests
    grown = process.memory_info().rss - before
    assert grown < 100 << 20, f"RSS grew {grown >> 20} MiB"
    # Each took 0.7 s or more to tokenize; refusing takes milliseconds. The bounds are
    # loose (the client and the server share this process, and a loaded machine slows
    # both): they catch a refusal that tokenizes, or a stalled event loop (seconds).
    assert sorted(seconds)[len(seconds) // 2] < 0.4 and max(seconds) < 1.0, sorted(seconds)
    assert max(health) < 0.5, sorted(health)[-5:]
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_a_too_long_text_completion_names_the_prompt(server) -> None:
    client = _client(server)
    for prompt in ("card " * 5000, NEAR_LIMIT, [7] * 5000):  # tokenized, by length, ids
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
        assert info.value.code == "context_length_exceeded"
        assert info.value.param == "prompt", info.value.body


# -- slow and malformed headers ----------------------------------------------------------


def _address(server: Server) -> tuple[str, int]:
    url = urlparse(server.url)
    return str(url.hostname), int(url.port or 80)


def test_300_connections_that_send_half_their_headers_are_closed(quick) -> None:
    half = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"
    selector = selectors.DefaultSelector()
    start = time.monotonic()
    sockets = []
    for i in range(300):
        sock = socket.create_connection(_address(quick), timeout=10)
        sock.sendall(half if i % 3 else b"")  # a third send nothing at all
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, bytearray())
        sockets.append(sock)
    open_ = set(sockets)
    replies = []
    while open_ and time.monotonic() - start < 1.0 + 5.0:
        for key, _ in selector.select(timeout=0.1):
            data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            if data:
                key.data.extend(data)
                continue
            selector.unregister(key.fileobj)
            open_.discard(key.fileobj)  # type: ignore[arg-type]
            replies.append(bytes(key.data))
    elapsed = time.monotonic() - start
    for sock in sockets:
        sock.close()
    assert not open_, f"{len(open_)} of 300 connections still open after {elapsed:.1f} s"
    assert len(replies) == 300
    head, _, body = replies[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), replies[0][:200]
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies)
    assert httpx.get(f"{quick.root}/health").status_code == 200


def _health(sock: socket.socket) -> bytes:
    """Ask /health on an open connection; the whole response."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while not reply.endswith(b'{"status":"ok"}'):
        chunk = sock.recv(65536)
        assert chunk, reply
        reply += chunk
    return reply


def test_the_header_timeout_also_covers_the_next_request_on_a_kept_connection(quick) -> None:
    with socket.create_connection(_address(quick), timeout=10) as sock:
        assert _health(sock).startswith(b"HTTP/1.1 200")
        time.sleep(1.5)  # longer than the header timeout: an idle kept connection stays
        assert _health(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /hea")
        start = time.monotonic()
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 3.0


@pytest.mark.parametrize(
    "head",
    [
        b"Content-Length: abc\r\n",
        b"Content-Length: -5\r\n",
        b"Content-Length: 2\r\nContent-Length: 3\r\n",
        b"Bad Header Line\r\n",
    ],
)
def test_a_malformed_header_gets_an_openai_shaped_400(quick, head: bytes) -> None:
    with socket.create_connection(_address(quick), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n{}")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status, _, rest = reply.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400"), reply
    assert b"content-type: application/json" in headers.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_http_request" and "Content-Length" in error["message"]
    assert httpx.get(f"{quick.root}/health").status_code == 200


# -- messages ----------------------------------------------------------------------------


def test_a_text_part_whose_text_is_not_a_string_is_called_that(server) -> None:
    client = _client(server)
    for parts, words in (
        ([{"type": "text", "text": 123}], "'text' is int; it must be a string"),
        ([{"type": "text"}], "'text' is null"),
        ([{"type": "image_url", "image_url": {"url": "x"}}], "type 'image_url'"),
    ):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=2
            )
        assert words in info.value.message and "Value error" not in info.value.message
        assert info.value.param == "messages.0.content"
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=2,
    )  # fmt: skip
    assert reply.choices


# -- keys --------------------------------------------------------------------------------


def test_keys_clients_cannot_send_are_refused_at_start_up(tmp_path, capsys, monkeypatch) -> None:
    assert check_api_key("sk-Abc_123.~!") == "sk-Abc_123.~!"
    for bad in ("two words", "clé", "\udcff\udcfe", "tab\there", ""):
        with pytest.raises(ValueError, match="printable ASCII"):
            check_api_key(bad or "\x00")
    with pytest.raises(ValueError, match="MAGE_API_KEY: character 1"):
        resolve_api_key(None, None, {"MAGE_API_KEY": "\udcffkey"})  # undecodable bytes
    (tmp_path / "key").write_bytes(b"\xff\xfekey\n")
    with pytest.raises(ValueError, match="not text"):
        resolve_api_key(None, str(tmp_path / "key"), {})
    with pytest.raises(ValueError, match="printable ASCII"):
        create_app(object(), MODEL, api_key="clé")  # type: ignore[arg-type]
    monkeypatch.setenv("MAGE_API_KEY", "caf\u00e9")
    assert main(["serve", "tiny"]) == 2  # refused before the model loads
    assert "MAGE_API_KEY: character 4" in capsys.readouterr().out


def test_a_token_with_other_bytes_is_a_401_not_a_500(keyed_server) -> None:
    with pytest.raises(APIError) as info:
        check_key("test-key", "Bearer caf\u00e9\udcff")
    assert info.value.status == 401
    for token in (b"caf\xc3\xa9", b"\xff\xfe\x80", b"test-key\xff"):
        with socket.create_connection(_address(keyed_server), timeout=10) as sock:
            sock.sendall(
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token + b"\r\n"
                b"Connection: close\r\n\r\n"
            )
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 401"), reply[:300]
        assert b'"invalid_api_key"' in reply


# -- a stream cut by the drain limit -----------------------------------------------------


def test_a_stream_cut_by_the_drain_limit_ends_with_an_error_event_and_done(tiny) -> None:
    model, tokenizer = tiny
    endless = {"model": MODEL, "messages": HI, "max_tokens": 4000, "ignore_eos": True,
               "stream": True}  # fmt: skip
    lines: list[str] = []
    raised: list[BaseException] = []
    with LocalEngine(model, tokenizer, name=MODEL) as engine:
        serving = serve_in_thread(create_app(engine, MODEL), drain_timeout_s=0.5)
        url = serving.__enter__()

        def raw() -> None:
            with httpx.stream("POST", f"{url}/chat/completions", json=endless, timeout=30) as r:
                lines.extend(line for line in r.iter_lines() if line)

        def sdk() -> None:
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            try:
                for _ in client.chat.completions.create(
                    model=MODEL, messages=HI, max_tokens=4000, stream=True,
                    extra_body={"ignore_eos": True},
                ):  # fmt: skip
                    pass
            except openai.APIError as error:
                raised.append(error)

        threads = [threading.Thread(target=raw), threading.Thread(target=sdk)]
        for thread in threads:
            thread.start()
        time.sleep(0.8)  # both stream
        serving.__exit__(None, None, None)  # shut down: 0.5 s to drain, then cancel
        for thread in threads:
            thread.join(30)
        # The engine's worker counts a cancellation when it next looks at the request,
        # which may come after the HTTP streams have ended.
        deadline = time.monotonic() + 10
        while engine.stats.cancelled < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.stats.cancelled >= 2
    assert len(lines) > 3 and lines[-1] == "data: [DONE]", lines[-3:]
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "shutting down" in error["message"]
    assert len(raised) == 1 and "shutting down" in str(raised[0])


# -- what bounds memory under load -------------------------------------------------------


def test_the_prefix_cache_holds_at_most_its_entries(tiny) -> None:
    args = build_parser().parse_args(["serve", "tiny", "--prefix-cache-entries", "8"])
    assert args.prefix_cache_entries == 8 and args.header_timeout == 10.0
    assert build_parser().parse_args(["serve", "tiny"]).prefix_cache_entries == 1024
    model, tokenizer = tiny
    with (
        LocalEngine(model, tokenizer, name=MODEL, prefix_cache_entries=8) as engine,
        serve_in_thread(create_app(engine, MODEL)) as url,
    ):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        for i in range(30):
            content = f"request {i}: " + " ".join(str(i * j) for j in range(20))
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=2
            )
        assert engine.prefix_cache is not None and len(engine.prefix_cache) == 8
        assert engine.prefix_cache.stats.evicted > 0
    with LocalEngine(model, tokenizer, name=MODEL, prefix_cache_entries=0) as engine:
        assert engine.prefix_cache is None
