"""What stands between the network and the routes: keys, body limits, parse limits.

:class:`Guard` is a plain ASGI middleware (not Starlette's ``BaseHTTPMiddleware``, which
hides client disconnects from the routes). For every HTTP request it

1. checks the API key, when the server has one, on every path but ``/health`` (the
   OpenAPI schema included: it lists what the server accepts);
2. refuses a body larger than ``max_body_bytes`` with 413 before reading it when
   ``Content-Length`` says so, and while reading it otherwise (chunked uploads);
3. gives the body ``body_timeout_s`` to arrive: a client that announced more bytes than
   it sends gets a 408 instead of holding the connection forever;
4. turns any unexpected exception into an OpenAI-shaped 500 and keeps serving, and a
   request cancelled by a shutdown's drain limit into a 503 (a stream already under way
   gets the error as its last event, then ``data: [DONE]``);
5. after a request with a large body, hands the memory it freed back to the system
   (:class:`_Releaser`).

:func:`parse_json` then parses the body off the event loop and refuses, with 400s, what
would otherwise reach the model as a 500: nesting deeper than :data:`MAX_JSON_DEPTH`
(Python's parser raises ``RecursionError`` near 1,000 levels) and lone UTF-16
surrogates (``"\\ud800"`` is valid JSON but not encodable text, so the tokenizer fails).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from mage_rl.memory import can_release, release_free_memory
from mage_rl.serve.protocol import APIError

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 2 << 20
"""2 MiB. A full 128k-token context is about 0.5 MB as text and 1 MB as token ids. The
bound also bounds the pauses of the event loop: the tokenizer holds the interpreter lock
for about 30 ms per MB of text when it hands its result back."""
DEFAULT_BODY_TIMEOUT_S = 30.0
MAX_JSON_DEPTH = 32
PUBLIC_PATHS = ("/health",)
_SHUTDOWN_MESSAGE = "the server is shutting down and could not finish this request; retry"


class Guard:
    """ASGI middleware enforcing the key, the body limits and JSON error bodies.

    Args:
        app: The application to guard.
        api_key: The key clients must send as ``Authorization: Bearer <key>``; ``None``
            lets everyone in.
        max_body_bytes: Largest request body accepted.
        body_timeout_s: Time the whole body may take to arrive.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        if body_timeout_s <= 0:
            raise ValueError(f"body_timeout_s must be > 0, got {body_timeout_s}")
        if api_key:
            check_api_key(api_key)
        self.app = app
        self.api_key = api_key or None
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = streaming = finished = False

        async def tracked_send(message: Message) -> None:
            nonlocal started, streaming, finished
            if message["type"] == "http.response.start":
                started = True
                streaming = any(
                    k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                    for k, v in message.get("headers", [])
                )
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        body_bytes = [0]
        try:
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            if scope["path"] not in PUBLIC_PATHS:
                check_key(self.api_key, headers.get("authorization", ""))
            self._check_length(headers.get("content-length"))
            await self.app(scope, self._limited(receive, body_bytes), tracked_send)
        except APIError as error:
            release_frames(error)
            if not started:
                await send_error(send, error)
        except asyncio.CancelledError:  # the drain limit of a shutdown ran out
            error = APIError(503, _SHUTDOWN_MESSAGE, "server_error")
            if not started:
                await send_error(send, error)
            elif streaming and not finished:  # end the stream as a stream that failed does
                await _end_stream(send, error)
            else:
                raise  # a plain response half sent: only dropping the connection is left
            # Answered: the request ends here, without uvicorn's traceback of the cancel.
            logger.warning("%s %s cut at the drain limit", scope.get("method"), scope["path"])
        except Exception as error:  # the last line of defence: log it, answer 500, keep serving
            logger.exception("unexpected error on %s %s", scope.get("method"), scope["path"])
            release_frames(error)
            if not started:
                error = APIError(500, "internal server error (see the server log)", "server_error")
                await send_error(send, error)
        finally:
            if body_bytes[0] >= RELEASE_AFTER_BYTES:
                _RELEASER.soon()

    def _check_length(self, value: str | None) -> None:
        if value is None:
            return
        try:
            length = int(value)
        except ValueError:
            raise APIError(400, f"Content-Length {value!r} is not a number") from None
        if length > self.max_body_bytes:
            raise _too_large(self.max_body_bytes)

    def _limited(self, receive: Receive, counted: list[int]) -> Receive:
        """``receive`` that counts body bytes (into ``counted[0]``) and bounds the time
        the body takes."""
        received = 0
        body_done = False
        deadline = time.monotonic() + self.body_timeout_s

        async def limited() -> Message:
            nonlocal received, body_done
            if body_done:  # later messages: the disconnect, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                raise APIError(
                    408,
                    f"the request body did not arrive within {self.body_timeout_s:g} s; "
                    "send as many bytes as Content-Length announces",
                    code="request_timeout",
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                counted[0] = received
                if received > self.max_body_bytes:
                    raise _too_large(self.max_body_bytes)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        return limited


async def _end_stream(send: Send, error: APIError) -> None:
    """The last events of a stream cut short: the error, then ``[DONE]``."""
    events = f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
    try:
        await send({"type": "http.response.body", "body": events, "more_body": False})
    except Exception:  # the client is gone or the connection closed: nothing to tell
        logger.debug("could not end a stream cut by the shutdown", exc_info=True)


KEY_RULE = (
    "an API key must be printable ASCII without spaces (letters, digits and punctuation), "
    "which every HTTP client can send in an Authorization header"
)


def check_api_key(key: str, source: str = "the API key") -> str:
    """Return ``key`` if clients can send it: printable ASCII, no spaces.

    HTTP header values are bytes that servers read as Latin-1, so a key with other
    characters could never be matched (and one holding undecodable bytes from the
    environment used to make every authenticated request fail with a 500).

    Raises:
        ValueError: Naming ``source`` and the first character at fault.
    """
    for i, char in enumerate(key):
        if not "!" <= char <= "~":
            shown = char.encode("utf-8", "surrogateescape").hex(" ")
            raise ValueError(
                f"{source}: character {i + 1} of the API key (bytes {shown}) is not "
                f"printable ASCII; {KEY_RULE}"
            )
    return key


RELEASE_AFTER_BYTES = 128 << 10
"""A request with a body this large has its memory handed back to the system after it.

Far above an ordinary agent or chat message (a few KB), and low enough to catch the
requests whose parsing and tokenizing allocate tens of MB: 1,000 legal actions of 1,000
characters are a body just under 1 MiB and about 12 MB of freed memory each."""


class _Releaser:
    """Hands the memory that large requests freed back to the operating system.

    A large request allocates several copies of its body (bytes, parsed JSON, the
    rendered prompt, its tokens) on whichever worker thread ran it. glibc keeps what is
    freed in that thread's arena for reuse, so a server that refused a few dozen
    near-limit prompts kept 100 MB or more of resident memory it no longer used. ``malloc_trim(0)`` returns
    the free pages; it runs on a worker thread, at most once per burst of large requests.
    Elsewhere than glibc (macOS, musl) there is no such call and nothing is done.
    """

    def __init__(self) -> None:
        self._scheduled = False

    def soon(self, delay_s: float = 0.05) -> None:
        if not can_release() or self._scheduled:
            return
        self._scheduled = True
        asyncio.get_running_loop().call_later(delay_s, self._run)

    def _run(self) -> None:
        self._scheduled = False
        asyncio.get_running_loop().run_in_executor(None, release_free_memory)


def release_frames(error: BaseException) -> None:
    """Drop the local variables of the finished frames that an answered error still holds.

    A failed request's traceback keeps every frame it passed through, and with them what
    those frames built: the 1,000 token lists of a message whose choices cannot fit, about
    12 MB. The exception, its frames and the event loop's tasks form reference cycles, so
    without this the memory stays until the next full garbage collection, which a serving
    process with frozen objects seldom runs. Frames still executing are left as they are;
    line numbers stay, so a traceback logged later still reads the same.
    """
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]


_RELEASER = _Releaser()


def check_key(api_key: str | None, authorization: str) -> None:
    """Raise a 401 unless ``authorization`` is ``Bearer <api_key>`` (or no key is set).

    ``authorization`` is the header as Latin-1 text (how ASGI servers hand headers over),
    so its bytes are compared with the key's: a token with any other bytes is simply
    wrong, never an error (keys are printable ASCII, see :func:`check_api_key`).
    """
    if api_key is None:
        return
    scheme, _, token = authorization.partition(" ")
    sent = token.strip().encode("latin-1", "replace")
    expected = api_key.encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent, expected):
        raise APIError(
            401,
            "missing or incorrect API key; send 'Authorization: Bearer <key>' with the key "
            "the server was started with (--api-key-file, MAGE_API_KEY or --api-key)",
            type="authentication_error",
            code="invalid_api_key",
        )


async def send_error(send: Send, error: APIError) -> None:
    """Send ``error`` as a complete JSON response."""
    body = json.dumps(error.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than this server's limit of {limit} bytes; send a "
        "shorter prompt or start the server with a larger --max-body-mb",
        code="request_too_large",
    )


def parse_json(raw: bytes) -> dict[str, Any]:
    """Parse a request body into a JSON object, refusing what the model cannot take.

    Raises:
        APIError: 400 for invalid JSON, a non-object, nesting deeper than
            :data:`MAX_JSON_DEPTH` or a string holding a lone surrogate.
    """
    try:
        data = json.loads(raw)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as error:
        raise APIError(
            400, f"the request body is not valid JSON ({error})", code="invalid_json"
        ) from error
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    _check_tree(data)
    return data


def _check_tree(data: dict[str, Any]) -> None:
    """Walk the parsed body iteratively: depth and encodable strings."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            if depth > MAX_JSON_DEPTH:
                raise _too_deep()
            for key, value in node.items():
                _check_text(key, path or "body")
                stack.append((value, depth + 1, f"{path}.{key}" if path else key))
        elif isinstance(node, list):
            if depth > MAX_JSON_DEPTH:
                raise _too_deep()
            stack.extend((value, depth + 1, f"{path}.{i}") for i, value in enumerate(node))
        elif isinstance(node, str):
            _check_text(node, path)


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = text[error.start : error.end]
        raise APIError(
            400,
            f"{path} holds a lone UTF-16 surrogate ({bad.encode('unicode_escape').decode()}), "
            "which is not text; encode characters outside the BMP as surrogate pairs",
            param=path or None,
            code="invalid_text",
        ) from None


def _too_deep() -> APIError:
    return APIError(
        400,
        f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels",
        code="invalid_json",
    )
