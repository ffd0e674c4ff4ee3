"""The bodies of the API's answers: model cards, choices, usage, and server-sent event
streams in OpenAI's shapes (the routes live in :mod:`.app`)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi.responses import StreamingResponse

from mage_rl.policy.base import SamplingParams
from mage_rl.serve.generate import (
    Choice,
    DoneEvent,
    LegacyOffsets,
    TokenEvent,
    chat_logprobs,
    completion_logprobs,
    stream_choices,
)
from mage_rl.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from mage_rl.serve.agent import AgentSessions
    from mage_rl.serve.app import ServerState

logger = logging.getLogger(__name__)


def meta(prefix: str, state: ServerState) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.model_name,
    }


def model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "mage-rl",
        "max_model_len": state.engine.max_context,
    }


def agent_card(state: ServerState, agent: AgentSessions) -> dict[str, Any]:
    """The served agent's entry in ``/v1/models`` (``mage``: what a client needs to play)."""
    return {
        "id": agent.name,
        "object": "model",
        "created": state.created,
        "owned_by": "mage-rl",
        "mage": {"agent": True, "episodes": agent.episodes, "model": state.model_name},
    }


def usage(prompt_len: int, choices: list[Choice]) -> dict[str, int]:
    completion = sum(len(c.generation.response_ids) for c in choices)
    return {"prompt_tokens": prompt_len, "completion_tokens": completion,
            "total_tokens": prompt_len + completion}  # fmt: skip


def chat_choice(state: ServerState, body: ChatCompletionRequest, c: Choice) -> dict[str, Any]:
    g = c.generation
    choice: dict[str, Any] = {
        "index": c.index,
        "message": {"role": "assistant", "content": c.text},
        "logprobs": chat_logprobs(state.engine.tokenizer, g.response_ids, g.logprobs, c.top)
        if body.logprobs
        else None,
        "finish_reason": g.finish_reason,
    }
    if body.return_token_ids:
        choice["token_ids"] = g.response_ids
    return choice


def completion_choice(
    state: ServerState, body: CompletionRequest, prompt: list[int], c: Choice
) -> dict[str, Any]:
    g = c.generation
    choice: dict[str, Any] = {
        "index": c.index,
        "text": c.text,
        "logprobs": completion_logprobs(
            state.engine.tokenizer, g.response_ids, g.logprobs, c.top, c.text
        )
        if body.logprobs is not None
        else None,
        "finish_reason": g.finish_reason,
    }
    if body.return_token_ids:
        choice["prompt_token_ids"] = prompt
        choice["token_ids"] = g.response_ids
    return choice


def sse(events: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        try:
            async for event in events:
                yield f"data: {json.dumps(event)}\n\n"
        except ValueError as error:  # this request's own sampling failed (see decoding)
            body = APIError(400, f"generation failed for this request: {error}").body()
            yield f"data: {json.dumps(body)}\n\n"
        except Exception as error:  # headers are sent: report in-band, then end cleanly
            logger.exception("stream failed")
            body = APIError(500, f"generation failed: {error}", type="server_error").body()
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})  # fmt: skip


async def _stream_chunks(
    state: ServerState,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: list[int],
    params: list[SamplingParams],
    top: int,
    chunk: Callable[..., dict[str, Any]],
    token_choice: Callable[[TokenEvent], dict[str, Any]],
    done_choice: Callable[[DoneEvent], dict[str, Any]],
) -> AsyncIterator[dict[str, Any]]:
    """The event loop both stream kinds share: one chunk a token, one a finished choice,
    then usage if asked; ``token_choice`` and ``done_choice`` give each kind's fields."""
    finished: list[Choice] = []
    async for event in stream_choices(
        state.engine, prompt, params, top_logprobs=top,
        include_stop=body.include_stop_str_in_output, ignore_eos=body.ignore_eos,
    ):  # fmt: skip
        if isinstance(event, DoneEvent):
            finished.append(event.choice)
            yield chunk([done_choice(event)])
            continue
        choice = token_choice(event)
        if body.return_token_ids:
            choice["token_ids"] = [event.token]
        yield chunk([choice])
    if body.include_usage_in_stream():
        yield chunk([], usage=usage(len(prompt), finished))


async def chat_stream(
    state: ServerState,
    body: ChatCompletionRequest,
    prompt: list[int],
    params: list[SamplingParams],
    top: int,
    meta: dict[str, Any],
) -> AsyncIterator[dict[str, Any]]:
    tokenizer = state.engine.tokenizer

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {**meta, "object": "chat.completion.chunk", "choices": choices, **extra}

    def token_choice(event: TokenEvent) -> dict[str, Any]:
        logprobs = None
        if body.logprobs:
            logprobs = chat_logprobs(tokenizer, [event.token], [event.logprob], [event.top])
        return {"index": event.index, "delta": {"content": event.delta},
                "logprobs": logprobs, "finish_reason": None}  # fmt: skip

    def done_choice(event: DoneEvent) -> dict[str, Any]:
        return {"index": event.choice.index,
                "delta": {"content": event.delta} if event.delta else {},
                "logprobs": None, "finish_reason": event.choice.generation.finish_reason}  # fmt: skip

    first: dict[str, Any] = {"prompt_token_ids": prompt} if body.return_token_ids else {}
    yield chunk(
        [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
          "finish_reason": None} for i in range(len(params))],
        **first,
    )  # fmt: skip
    async for event in _stream_chunks(
        state, body, prompt, params, top, chunk, token_choice, done_choice
    ):
        yield event


async def completion_stream(
    state: ServerState,
    body: CompletionRequest,
    prompt: list[int],
    params: list[SamplingParams],
    top: int,
    meta: dict[str, Any],
) -> AsyncIterator[dict[str, Any]]:
    offsets = [LegacyOffsets(state.engine.tokenizer) for _ in params]

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {**meta, "object": "text_completion", "choices": choices, **extra}

    def token_choice(event: TokenEvent) -> dict[str, Any]:
        logprobs = None
        if body.logprobs is not None:
            logprobs = offsets[event.index].entries([event.token], [event.logprob], [event.top])
        return {"index": event.index, "text": event.delta,
                "logprobs": logprobs, "finish_reason": None}  # fmt: skip

    def done_choice(event: DoneEvent) -> dict[str, Any]:
        return {"index": event.choice.index, "text": event.delta, "logprobs": None,
                "finish_reason": event.choice.generation.finish_reason}  # fmt: skip

    async for event in _stream_chunks(
        state, body, prompt, params, top, chunk, token_choice, done_choice
    ):
        yield event
