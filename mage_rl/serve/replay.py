"""Bringing a session back: its graph run again over its log, the model's answers replayed.

A session's state is whatever its graph holds while it waits for the client: state
channels, the tracer, the chat model's call count, a plugin's own variables. Rather than
serialise that, the server keeps what determines it: the messages the client sent and
every answer the model gave (:mod:`mage_rl.serve.store`). To restore a session (after a
restart, or to undo a message that failed) it runs a fresh graph over the logged
messages while :class:`RecordingPolicy` hands the graph's model calls their logged
answers instead of sampling: no forward pass, and the same calls, answers and state as
before. Once the log is spent, calls go to the engine again and are recorded.

Each logged call carries a digest of what was asked (the prompt and the sampling
settings, seed included). A replayed call that asks something else means the graph does
not retrace its steps (a node that reads the clock or its own random numbers, or a run
whose prompts changed); the session then cannot be restored, and says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from mage_rl.policy.base import Generation, Message, SamplingParams


class ReplayDiverged(RuntimeError):
    """The graph asked the model something other than what the log holds."""


class RecordingPolicy:
    """A policy that answers from a log first, then from ``policy`` while recording.

    Args:
        policy: The engine (anything with ``generate`` and, for the conversation layout,
            ``generate_from_ids`` and ``tokenizer``).
        script: Logged calls to answer first, in order (:meth:`record` dicts).
    """

    def __init__(self, policy: Any, script: Sequence[dict[str, Any]] = ()) -> None:
        self.policy = policy
        self.name = getattr(policy, "name", "policy")
        self.script = list(script)
        self.played = 0
        self.fresh: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:  # tokenizer, max_context, ... of the engine
        return getattr(self.policy, name)

    @property
    def replaying(self) -> bool:
        return self.played < len(self.script)

    def take(self) -> list[dict[str, Any]]:
        """The calls recorded since the last ``take``."""
        out, self.fresh = self.fresh, []
        return out

    async def generate(self, messages: list[Message], params: SamplingParams) -> Generation:
        return await self._answer(messages, params, lambda: self.policy.generate(messages, params))

    async def generate_from_ids(
        self, prompt_ids: Sequence[int], params: SamplingParams, **kwargs: Any
    ) -> Generation:
        ids = [int(i) for i in prompt_ids]
        return await self._answer(
            ids, params, lambda: self.policy.generate_from_ids(ids, params, **kwargs)
        )

    async def _answer(self, prompt: Any, params: SamplingParams, sample: Any) -> Generation:
        # A prompt can be megabytes of text: hashing it is the worker thread's job.
        asked = await asyncio.to_thread(_digest, prompt, params)
        if self.replaying:
            logged = self.script[self.played]
            if logged["asked"] != asked:
                raise ReplayDiverged(
                    f"call {self.played + 1} of the log asked the model something else than "
                    "the graph asks now (its prompt or sampling differ)"
                )
            self.played += 1
            return _generation(logged)
        generation: Generation = await sample()
        self.fresh.append(record(asked, generation))
        return generation


def record(asked: str, g: Generation) -> dict[str, Any]:
    """A logged call. The prompt's ids are kept as their count only: the replayed call
    reports the same prompt length, and the log stays small (a prompt is re-rendered
    by every call of a meta-episode)."""
    return {
        "asked": asked,
        "text": g.text,
        "prompt_tokens": len(g.prompt_ids),
        "response_ids": g.response_ids,
        "logprobs": g.logprobs,
        "finish_reason": g.finish_reason,
        "allowed": g.allowed,
    }


def _generation(logged: dict[str, Any]) -> Generation:
    return Generation(
        text=logged["text"],
        prompt_ids=[0] * int(logged["prompt_tokens"]),  # the length is what is reported
        response_ids=list(logged["response_ids"]),
        logprobs=list(logged["logprobs"]),
        finish_reason=logged["finish_reason"],
        allowed=[list(a) for a in logged["allowed"]],
    )


def _digest(prompt: Any, params: SamplingParams) -> str:
    text = json.dumps([prompt, dataclasses.asdict(params)], ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
