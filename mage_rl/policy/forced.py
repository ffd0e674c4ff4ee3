"""Forced tokens of a constrained request: taken while only one token is allowed next.

A constrained request's prompt is followed by the tokens all its choices share (``<action>``
of ``<action>PASS</action>`` and ``<action>BET</action>``); once a single choice is left,
its remaining tokens follow. Each such token is the only allowed one: it needs no draw
and its restricted log-prob is exactly 0.
"""

from __future__ import annotations

from mage_rl.policy.constrained import allowed_next
from mage_rl.policy.requests import DecodeRequest


def complete_forced(request: DecodeRequest) -> None:
    """Once one choice is left, append its remaining tokens without forward passes.

    Only then: a token appended in the middle of decoding would be missing from the KV
    cache, while a finished request needs no further forward pass.
    """
    assert request.candidates is not None
    prefix = request.response_ids
    if sum(list(c[: len(prefix)]) == prefix for c in request.candidates) == 1:
        take_forced(request)


def take_forced(request: DecodeRequest) -> list[int]:
    """Append tokens while only one is allowed next; return them.

    Each such token is the only allowed one, so its restricted log-prob is exactly 0.
    """
    assert request.candidates is not None
    taken = []
    while len(allowed := allowed_next(request.candidates, request.response_ids)) == 1:
        request.response_ids.append(allowed[0])
        request.logprobs.append(0.0)
        request.allowed.append([allowed[0]])
        taken.append(allowed[0])
    return taken
