"""Session handles: the credential a client holds for its agent session.

A handle is 192 random bits from the operating system's generator (``secrets``), issued
by the server with a session's first answer and required with every later message. It
is the session's only name on the wire: the ``user`` field is a label for logs.

The server never keeps a handle itself. It keys sessions, in memory and on disk, by the
SHA-256 of the handle, so a copy of the state directory does not hand out the sessions
it holds. When the server has an API key, a session is also bound to the key that
opened it (by an HMAC of the key under a secret of the state directory): a request that
shows the right handle with another key finds no session, exactly as a wrong handle
does.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

HANDLE_BYTES = 24
"""192 bits: far past guessing, and 32 URL-safe characters."""
_HANDLE = re.compile(r"[A-Za-z0-9_-]{32}")


def new_handle() -> str:
    """A fresh session handle."""
    return secrets.token_urlsafe(HANDLE_BYTES)


def handle_key(handle: str) -> str | None:
    """The key a session is kept under (hex SHA-256 of its handle), or ``None`` for a
    string that is no handle at all (which then finds no session)."""
    if not _HANDLE.fullmatch(handle):
        return None
    return hashlib.sha256(handle.encode("ascii")).hexdigest()


def owner_of(api_key: str | None, secret: bytes) -> str:
    """Who opened a session: an HMAC of the API key it was opened with, or '' when the
    server has no key."""
    if not api_key:
        return ""
    return hmac.new(secret, api_key.encode("utf-8", "surrogateescape"), "sha256").hexdigest()


def same_owner(a: str, b: str) -> bool:
    """Whether two owners are the same, in time that does not depend on where they differ."""
    return hmac.compare_digest(a.encode(), b.encode())
