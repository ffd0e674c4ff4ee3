"""Bad requests get OpenAI-shaped 4xx errors, and the server keeps answering."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY, MODEL

GOOD = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
LONG = "card " * 5000  # ~5,000 tokens: longer than the tiny model's 4,096-token context


def _with(**changes) -> dict:
    return {**GOOD, **changes}


BAD_REQUESTS = [
    ("malformed JSON", "post", "/chat/completions", b'{"model": "tiny", "messages": [', 400, "invalid_json"),
    ("not an object", "post", "/chat/completions", b"[1, 2]", 400, "invalid_json"),
    ("unknown model", "post", "/chat/completions", _with(model="gpt-9"), 404, "model_not_found"),
    ("no messages", "post", "/chat/completions", _with(messages=[]), 400, None),
    ("unknown role", "post", "/chat/completions", _with(messages=[{"role": "bot", "content": "x"}]), 400, None),
    ("temperature too high", "post", "/chat/completions", _with(temperature=2.5), 400, None),
    ("negative temperature", "post", "/chat/completions", _with(temperature=-1), 400, None),
    ("top_p zero", "post", "/chat/completions", _with(top_p=0), 400, None),
    ("max_tokens zero", "post", "/chat/completions", _with(max_tokens=0), 400, None),
    ("n zero", "post", "/chat/completions", _with(n=0), 400, None),
    ("n too large", "post", "/chat/completions", _with(n=1000), 400, None),
    ("top_logprobs too large", "post", "/chat/completions", _with(logprobs=True, top_logprobs=50), 400, None),
    ("top_logprobs without logprobs", "post", "/chat/completions", _with(top_logprobs=2), 400, None),
    ("five stop strings", "post", "/chat/completions", _with(stop=["a", "b", "c", "d", "e"]), 400, None),
    ("wrong type", "post", "/chat/completions", _with(max_tokens="many"), 400, None),
    ("tools", "post", "/chat/completions", _with(tools=[{"type": "function", "function": {"name": "f"}}]), 400, None),
    ("penalty", "post", "/chat/completions", _with(presence_penalty=1.0), 400, None),
    ("prompt over context", "post", "/chat/completions", _with(messages=[{"role": "user", "content": LONG}]), 400, "context_length_exceeded"),
    ("prompt + max_tokens over context", "post", "/chat/completions", _with(max_tokens=4090), 400, "context_length_exceeded"),
    ("completion over context", "post", "/completions", {"model": MODEL, "prompt": LONG}, 400, "context_length_exceeded"),
    ("completion token out of vocab", "post", "/completions", {"model": MODEL, "prompt": [10**9]}, 400, None),
    ("completion logprobs too large", "post", "/completions", {"model": MODEL, "prompt": "x", "logprobs": 9}, 400, None),
    ("completion echo", "post", "/completions", {"model": MODEL, "prompt": "x", "echo": True}, 400, None),
    ("unknown route", "post", "/embeddings", GOOD, 404, "not_found"),
    ("wrong method", "get", "/chat/completions", None, 405, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_gets_json_error_then_good_request_succeeds(
    server, method: str, path: str, body, status: int, code: str | None
) -> None:
    url = f"{server.url}{path}"
    if method == "get":
        response = httpx.get(url)
    elif isinstance(body, bytes):
        response = httpx.post(url, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    good = httpx.post(f"{server.url}/chat/completions", json=GOOD, timeout=60)
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["role"] == "assistant"


def test_validation_errors_name_the_parameter(server) -> None:
    response = httpx.post(f"{server.url}/chat/completions", json=_with(temperature=3))
    error = response.json()["error"]
    assert error["param"] == "temperature" and "temperature" in error["message"]


def test_openai_client_raises_its_typed_errors(server) -> None:
    client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="gpt-9"):
        client.chat.completions.create(model="gpt-9", messages=GOOD["messages"])
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG}])


def test_api_key_is_checked_when_set(keyed_server) -> None:
    url = f"{keyed_server.url}/chat/completions"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.post(url, json=GOOD, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{keyed_server.url}/models").status_code == 401
    assert httpx.get(f"{keyed_server.root}/health").status_code == 200  # probes need no key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.url, api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=keyed_server.url, api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=GOOD["messages"], max_tokens=3)
    assert reply.choices[0].message.role == "assistant"


def test_client_leaving_a_stream_does_not_hurt_the_server(server) -> None:
    body = _with(max_tokens=200, stream=True)
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=60) as r:
        for _line in r.iter_lines():
            break  # hang up after the first event
    good = httpx.post(f"{server.url}/chat/completions", json=GOOD, timeout=60)
    assert good.status_code == 200
