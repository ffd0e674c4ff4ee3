"""The OpenAI-compatible HTTP API over a :class:`~mage_rl.policy.engine.LocalEngine`.

Routes: ``GET /health``, ``GET /v1/models``, ``GET /v1/models/{model}``,
``POST /v1/chat/completions`` and ``POST /v1/completions`` (see :mod:`.protocol` for the
fields). Every request is one coroutine that awaits the engine, so concurrent requests
land in the same decode batches and share forward passes.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``:

* 400: malformed JSON, nesting too deep, lone surrogates, a body that fails validation
  (ranges and strict types, see :mod:`.protocol`), an unsupported field, a prompt (plus
  ``max_tokens``) longer than the model's context (refused from its length alone, before
  tokenizing, when no tokenization of that many characters could fit), a chat template
  that rejects the messages, sampling that fails for this request alone; a request line
  or headers that cannot be parsed (:mod:`.connection`);
* 401: missing or wrong API key (only when the server has one; every path but
  ``/health``);
* 404: unknown model or route; 405: wrong method; 408: headers or a body that do not
  arrive in time; 413: a body over the size limit (:mod:`.limits`);
* 500: anything unexpected, logged with its traceback; 503: the engine is shut down.

No request can stop the server or hurt another: bodies are bounded before parsing,
parsing and tokenization run on worker threads so the event loop keeps answering, the
engine isolates each request's sampling, and a client that hangs up has its request
cancelled (the engine drops it at the next decode step).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from mage_rl.policy.base import SamplingParams
from mage_rl.policy.engine import EngineClosedError, LocalEngine
from mage_rl.policy.tokenization import max_chars_per_token, render_text
from mage_rl.serve import responses
from mage_rl.serve.agent import AgentSessions
from mage_rl.serve.agent_api import completion_body, env_message, stream_body
from mage_rl.serve.generate import (
    Choice,
    run_choices,
)
from mage_rl.serve.limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    Guard,
    check_api_key,
    parse_json,
    release_frames,
)
from mage_rl.serve.protocol import (
    MAX_MESSAGES,
    MAX_PROMPTS,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
)

logger = logging.getLogger(__name__)

RequestT = TypeVar("RequestT", bound=BaseModel)
T = TypeVar("T")


class ServerState:
    """What the routes share: the engine, the served name, the key and limits.

    Args:
        engine: The engine that answers every request.
        model_name: The name clients put in ``model``; other names get 404.
        api_key: When set, every path but ``/health`` needs
            ``Authorization: Bearer <api_key>``.
        default_max_tokens: Response limit when a request gives none (``None``: the room
            left in the context, as OpenAI does). Text completions default to 16, as in
            OpenAI's API.
    """

    def __init__(
        self,
        engine: LocalEngine,
        model_name: str,
        api_key: str | None = None,
        default_max_tokens: int | None = None,
        agent: AgentSessions | None = None,
    ) -> None:
        if api_key:
            check_api_key(api_key)  # one clients can send, or a clear error at start-up
        self.engine = engine
        self.model_name = model_name
        self.api_key = api_key or None
        self.default_max_tokens = default_max_tokens
        self.agent = agent
        self.created = int(time.time())
        # Most characters one token stands for: a longer text cannot fit the context.
        self.max_token_chars = max_chars_per_token(engine.tokenizer)

    # -- request checks ------------------------------------------------------------------

    def check_model(self, name: str) -> None:
        if name != self.model_name:
            served = repr(self.model_name)
            if self.agent is not None:
                served += f" (and the agent {self.agent.name!r}, on chat completions)"
            raise APIError(
                404,
                f"the model {name!r} does not exist on this server; it serves "
                f"{served} (see GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    def max_tokens(self, prompt_len: int, asked: int | None, param: str = "messages") -> int:
        """The response limit of a prompt, or a 400 when it cannot fit the context.

        ``param`` names the request field that holds the prompt (``messages`` for chats,
        ``prompt`` for text completions)."""
        context = self.engine.max_context
        room = context - prompt_len
        if room < 1:
            raise APIError(
                400,
                f"the prompt has {prompt_len} tokens but the model's context holds "
                f"{context}; shorten the prompt",
                param=param,
                code="context_length_exceeded",
            )
        if asked is not None:
            if asked > room:
                raise APIError(
                    400,
                    f"the prompt ({prompt_len} tokens) plus max_tokens ({asked}) exceeds the "
                    f"model's context of {context} tokens; ask for at most {room} tokens",
                    param="max_tokens",
                    code="context_length_exceeded",
                )
            return asked
        return min(room, self.default_max_tokens or room)

    def sampling(
        self, body: ChatCompletionRequest | CompletionRequest, max_tokens: int
    ) -> list[SamplingParams]:
        """One :class:`SamplingParams` per choice; seeded choices get ``seed + i``."""
        top_k = body.top_k if body.top_k and body.top_k > 0 else 0
        try:
            return [
                SamplingParams(
                    temperature=1.0 if body.temperature is None else body.temperature,
                    top_p=1.0 if body.top_p is None else body.top_p,
                    top_k=top_k,
                    max_tokens=max_tokens,
                    stop=body.stop_strings(),
                    seed=None if body.seed is None else body.seed + i,
                )
                for i in range(body.n)
            ]
        except ValueError as error:
            raise APIError(400, str(error)) from error

    def render(self, body: ChatCompletionRequest) -> list[int]:
        try:
            text = render_text(self.engine.tokenizer, body.chat())
        except Exception as error:  # template errors are jinja exceptions, not ValueError
            raise APIError(
                400, f"the chat template cannot render these messages: {error}", param="messages"
            ) from None
        return self.tokenize(text, "messages")

    def tokenize(self, text: str, param: str) -> list[int]:
        """Token ids of ``text``; a text too long to fit the context is refused from its
        length first, without tokenizing it (which would take seconds and hundreds of MB
        for a prompt of a few MB)."""
        context = self.engine.max_context
        if self.max_token_chars is not None:
            least = -(-len(text) // self.max_token_chars)
            if least >= context:
                raise APIError(
                    400,
                    f"the prompt has {len(text)} characters, so at least {least} tokens (no "
                    f"token of this model stands for more than {self.max_token_chars} "
                    f"characters), but the model's context holds {context}; shorten the prompt",
                    param=param,
                    code="context_length_exceeded",
                )
        return list(self.engine.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, "prompt")
        else:
            vocab = len(self.engine.tokenizer)
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"prompt token ids {bad[:5]} are outside [0, {vocab})",
                               param="prompt")  # fmt: skip
            ids = list(prompt)
        if not ids:
            raise APIError(400, "the prompt is empty", param="prompt")
        return ids


def create_app(
    engine: LocalEngine,
    model_name: str,
    *,
    api_key: str | None = None,
    default_max_tokens: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    agent: AgentSessions | None = None,
) -> FastAPI:
    """Build the FastAPI application.

    See :class:`ServerState` for the first four arguments and ``agent``,
    :class:`~mage_rl.serve.limits.Guard` for the body limits. With ``agent``, chat
    requests that name it play the trained agent (:mod:`mage_rl.serve.agent`).
    """
    state = ServerState(engine, model_name, api_key, default_max_tokens, agent)
    app = FastAPI(title="mage serve", version="1", docs_url="/docs", redoc_url=None)
    app.state.mage = state
    app.add_middleware(
        Guard, api_key=state.api_key, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s
    )

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, error: APIError) -> JSONResponse:
        release_frames(error)  # what the failed request built goes now, not at a full GC
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = (
            f"no route {request.method} {request.url.path}"
            if error.status_code in (404, 405)
            else str(error.detail)
        )
        api = APIError(
            error.status_code, message, code="not_found" if error.status_code == 404 else None
        )
        return JSONResponse(api.body(), status_code=error.status_code)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [responses.model_card(state)]
        if agent is not None:
            cards.insert(0, responses.agent_card(state, agent))
        return {"object": "list", "data": cards}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if agent is not None and model == agent.name:
            return responses.agent_card(state, agent)
        state.check_model(model)
        return responses.model_card(state)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        if agent is not None and body.model == agent.name:
            return await _agent_turn(request, agent, body)
        state.check_model(body.model)
        # Rendering and tokenizing a long chat takes a while: off the event loop.
        prompt = await asyncio.to_thread(state.render, body)
        params = state.sampling(body, state.max_tokens(len(prompt), body.token_limit()))
        top = (body.top_logprobs or 0) if body.logprobs else 0
        meta = responses.meta("chatcmpl", state)
        if body.stream:
            return responses.sse(responses.chat_stream(state, body, prompt, params, top, meta))
        choices = await _answered(
            request,
            run_choices(
                engine, prompt, params, top_logprobs=top,
                include_stop=body.include_stop_str_in_output, ignore_eos=body.ignore_eos,
            ),
        )  # fmt: skip
        out: dict[str, Any] = {
            **meta,
            "object": "chat.completion",
            # Log-probs decode every token and its alternatives: off the event loop too.
            "choices": await asyncio.to_thread(
                lambda: [responses.chat_choice(state, body, c) for c in choices]
            ),
            "usage": responses.usage(len(prompt), choices),
        }
        if body.return_token_ids:
            out["prompt_token_ids"] = prompt
        return JSONResponse(out)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        state.check_model(body.model)
        prompts = await asyncio.to_thread(lambda: [state.encode(p) for p in body.prompts()])
        if body.stream and len(prompts) > 1:
            raise APIError(400, "streaming takes a single prompt", param="prompt")
        plans = [
            (p, state.sampling(body, state.max_tokens(len(p), body.max_tokens, "prompt")))
            for p in prompts
        ]
        top = body.logprobs or 0
        meta = responses.meta("cmpl", state)
        if body.stream:
            prompt, params = plans[0]
            return responses.sse(
                responses.completion_stream(state, body, prompt, params, top, meta)
            )
        runs = [
            run_choices(
                engine, prompt, params, top_logprobs=top, include_stop=body.include_stop_str_in_output,
                first_index=k * body.n, ignore_eos=body.ignore_eos,
            )
            for k, (prompt, params) in enumerate(plans)
        ]  # fmt: skip
        done = await _answered(request, _gather(runs))
        choices = [
            (prompt, c) for (prompt, _), group in zip(plans, done, strict=True) for c in group
        ]
        out = {
            **meta,
            "object": "text_completion",
            "choices": await asyncio.to_thread(
                lambda: [responses.completion_choice(state, body, p, c) for p, c in choices]
            ),
            "usage": {
                "prompt_tokens": sum(len(p) for p in prompts),
                "completion_tokens": sum(len(c.generation.response_ids) for _, c in choices),
                "total_tokens": sum(len(p) for p in prompts)
                + sum(len(c.generation.response_ids) for _, c in choices),
            },
        }
        return JSONResponse(out)

    return app


# -- helpers -------------------------------------------------------------------------------


async def _agent_turn(
    request: Request, agent: AgentSessions, body: ChatCompletionRequest
) -> Response:
    """One request of an agent's session (:mod:`mage_rl.serve.agent`)."""
    # Validating a message of up to 2 MB takes a while: off the event loop.
    message = await asyncio.to_thread(env_message, body, agent.name)
    sampling = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                "seed": body.seed}  # fmt: skip
    owner = agent.owner(request.app.state.mage.api_key)  # the key the Guard let in
    turn = agent.turn(body.session, message, sampling, seq=body.seq, owner=owner,
                      user=body.user or "")  # fmt: skip
    reply = await _answered(request, turn)
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": agent.name}  # fmt: skip
    if body.stream:
        return responses.sse(stream_body(reply, meta, body.include_usage_in_stream()))
    # The answer holds every call's prompt, megabytes at worst: serialised off the loop.
    content = await asyncio.to_thread(lambda: json.dumps(completion_body(reply, meta)).encode())
    return Response(content, media_type="application/json")


async def _parse(request: Request, model: type[RequestT]) -> RequestT:
    try:
        raw = await request.body()  # bounded in size and time by the Guard
    except ClientDisconnect:
        raise APIError(400, "the client disconnected before sending the whole body") from None
    return await asyncio.to_thread(_validate, raw, model)


def _validate(raw: bytes, model: type[RequestT]) -> RequestT:
    data = parse_json(raw)
    # Counted before validation: pydantic validates a whole list in one call that holds
    # the interpreter lock, so a huge list would pause every other request meanwhile.
    for field, limit in (("messages", MAX_MESSAGES), ("prompt", MAX_PROMPTS)):
        items = data.get(field)
        if isinstance(items, list) and len(items) > limit:
            if field == "prompt" and all(isinstance(x, int) for x in items):
                continue  # one prompt of token ids; the context bounds it later
            raise APIError(
                400, f"{field} holds {len(items)} items; this server takes at most {limit}",
                param=field,
            )  # fmt: skip
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = error.errors()
        first = problems[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg'].removeprefix('Value error, ')}"
            for e in problems[:5]
        )
        raise APIError(400, f"invalid request: {message}", param=param) from error


async def _gather(runs: list[Awaitable[list[Choice]]]) -> list[list[Choice]]:
    tasks = [asyncio.ensure_future(run) for run in runs]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # one prompt failed or the client left: the others stop decoding too
        for task in tasks:
            task.cancel()


async def _answered(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client hangs up first; then cancel it.

    Cancelling reaches the engine, which drops the request before its next token (a
    client that gave up must not keep the batch busy until ``max_tokens``).
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        raise APIError(499, "the client closed the connection", code="client_closed_request")
    try:
        return task.result()
    except EngineClosedError as error:
        raise APIError(503, f"the server is shutting down ({error})", "server_error") from error
    except ValueError as error:  # this request's own sampling failed (see decoding)
        raise APIError(400, f"generation failed for this request: {error}") from error


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body is read; only that message is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
