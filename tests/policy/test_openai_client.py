"""OpenAIPolicy against a fake OpenAI-compatible server (client-side unit tests)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from mage_rl.policy.base import Policy, SamplingParams
from mage_rl.policy.openai_client import (
    EndpointError,
    EndpointUnreachableError,
    OpenAIPolicy,
    parse_chat_completion,
)

from .fake_openai import LOGPROBS, PROMPT_IDS, RESPONSE_IDS, TEXT

MESSAGES = [{"role": "user", "content": "Your card is K."}]


@pytest.fixture
def server(fake_server):
    fake_server.reset()
    return fake_server


def policy_for(url: str, **kwargs) -> OpenAIPolicy:
    kwargs.setdefault("backoff_initial", 0.01)
    kwargs.setdefault("backoff_max", 0.02)
    return OpenAIPolicy(url, "fake-model", timeout=5, **kwargs)


def test_generation_carries_ids_and_logprobs(server) -> None:
    policy = policy_for(server.base_url)
    assert isinstance(policy, Policy)
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=5, max_tokens=32, stop=("</action>",), seed=3
    )
    generation = asyncio.run(policy.generate(MESSAGES, params))
    assert generation.text == TEXT
    assert generation.prompt_ids == PROMPT_IDS
    assert generation.response_ids == RESPONSE_IDS
    assert generation.logprobs == LOGPROBS
    assert generation.finish_reason == "stop" and generation.has_tokens

    body = server.requests[-1]
    assert body["model"] == "fake-model" and body["messages"] == MESSAGES
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert body["include_stop_str_in_output"] is True
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 5)
    assert (body["max_tokens"], body["stop"], body["seed"]) == (32, ["</action>"], 3)


def test_missing_ids_give_empty_lists_and_length_is_reported(server) -> None:
    server.with_ids = False
    server.finish_reason = "length"
    policy = policy_for(server.base_url, vllm_extensions=False)
    generation = asyncio.run(policy.generate(MESSAGES, SamplingParams(top_k=3)))
    assert generation.prompt_ids == [] and generation.response_ids == []
    assert generation.logprobs == LOGPROBS and not generation.has_tokens
    assert generation.finish_reason == "length"
    body = server.requests[-1]
    assert "return_token_ids" not in body and "top_k" not in body


def test_transient_failures_are_retried(server) -> None:
    server.failures = [500, 429, 503]
    generation = asyncio.run(policy_for(server.base_url).generate(MESSAGES))
    assert generation.text == TEXT
    assert len(server.requests) == 4


def test_client_errors_are_not_retried(server) -> None:
    server.failures = [400, 400]
    with pytest.raises(EndpointError, match="HTTP 400") as error:
        asyncio.run(policy_for(server.base_url).generate(MESSAGES))
    assert server.base_url in str(error.value)
    assert len(server.requests) == 1


def test_retries_give_up_after_max_retries(server) -> None:
    server.failures = [502] * 10
    with pytest.raises(EndpointError, match="HTTP 502"):
        asyncio.run(policy_for(server.base_url, max_retries=2).generate(MESSAGES))
    assert len(server.requests) == 3


def test_unreachable_endpoint_names_the_url() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(EndpointUnreachableError, match=f"127.0.0.1:{port}/v1"):
        asyncio.run(policy_for(url, max_retries=1).generate(MESSAGES))


def test_one_client_per_event_loop(server) -> None:
    policy = policy_for(server.base_url)
    for _ in range(2):  # each asyncio.run is a new loop; a stale pool would fail here
        assert asyncio.run(policy.generate(MESSAGES)).text == TEXT


def test_parse_accepts_ids_on_the_response_or_the_choice() -> None:
    choice = {"message": {"content": "x"}, "finish_reason": "stop", "prompt_token_ids": [1, 2]}
    parsed = parse_chat_completion({"choices": [choice], "response_token_ids": [3]})
    assert (parsed.prompt_ids, parsed.response_ids, parsed.logprobs) == ([1, 2], [3], [])
    with pytest.raises(EndpointError, match="no choices"):
        parse_chat_completion({"choices": []})
