"""Local network helpers of the servers (``mage serve``, the vLLM server mage starts)."""

from __future__ import annotations

import socket

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""Addresses only this machine can reach: serving on them needs no API key."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
