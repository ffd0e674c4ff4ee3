"""The HTTP/1.1 connection handler of ``mage serve``: uvicorn's h11 protocol with a header
timeout and OpenAI-shaped answers to requests that never reach the application.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but a
connection that has sent part of a request's headers (or nothing yet) waits forever:
300 such connections stay open, each holding a socket and a file descriptor. Here a
timer runs from the moment a connection opens, or the first byte of its next request
arrives, until the request's headers are complete; when it fires the client gets a 408
and the connection is closed.

Requests that h11 cannot parse (a malformed ``Content-Length``, a header line without a
colon, headers over h11's 16 KiB limit) get uvicorn's plain-text 400; here they get the
JSON error body every other error has.
"""

from __future__ import annotations

import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

from mage_rl.serve.protocol import APIError

DEFAULT_HEADER_TIMEOUT_S = 10.0


def _error_bytes(error: APIError) -> bytes:
    return json.dumps(error.body()).encode()


class GuardedH11Protocol(H11Protocol):
    """:class:`H11Protocol` with a header timeout and JSON bodies on parse errors."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: Any = None

    # -- the header timer ---------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            # Still waiting for a complete request line and headers (a new connection,
            # or the next request on a kept-alive one): the clock runs from its first byte.
            if self._header_timer is None:
                self._arm_header_timer()
        else:
            self._disarm_header_timer()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0] or self.cycle is None:
            # Part of a request arrived (or none at all on a fresh connection): answer
            # 408 and hang up. An idle kept-alive connection is uvicorn's to close.
            error = APIError(
                408,
                f"the request's headers did not arrive within {self.header_timeout_s:g} s",
                code="request_timeout",
            )
            self._write_raw(error)
        self.transport.close()

    # -- answers for requests the application never sees ---------------------------------

    def send_400_response(self, msg: str) -> None:  # noqa: ARG002 (uvicorn's text)
        """Answer a request h11 could not parse with a JSON 400 (uvicorn's is plain text)."""
        error = APIError(
            400,
            "malformed HTTP request: its request line or headers could not be parsed (a "
            "Content-Length that is not a non-negative integer, a header line without ':', "
            "headers over 16 KiB, ...)",
            code="invalid_http_request",
        )
        body = _error_bytes(error)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            response = h11.Response(status_code=400, headers=headers, reason=STATUS_PHRASES[400])
            self.transport.write(self.conn.send(response) or b"")
            self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # h11 refuses to answer in this state: write it
            self._write_raw(error)
        self.transport.close()

    def _write_raw(self, error: APIError) -> None:
        body = _error_bytes(error)
        head = (
            f"HTTP/1.1 {error.status} {STATUS_PHRASES[error.status].decode()}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)


def protocol_class(header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> type[H11Protocol]:
    """:class:`GuardedH11Protocol` with this header timeout, for ``uvicorn.Config(http=...)``.

    Raises:
        ValueError: For a timeout that is not above 0.
    """
    if not header_timeout_s > 0:
        raise ValueError(f"the header timeout must be > 0 seconds, got {header_timeout_s}")
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": header_timeout_s})
