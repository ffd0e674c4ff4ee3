"""What the decode loop tracks: one request in flight, and counters over an engine's
lifetime (the loop itself is :mod:`mage_rl.policy.decoding`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mage_rl.policy.base import Generation, SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    """One request inside the decode loop.

    Attributes:
        prompt_ids: Rendered prompt ids.
        params: Sampling parameters.
        generator: This request's random stream.
        max_new_tokens: ``params.max_tokens`` capped by the model's context length.
        resolve: Called once, from the worker thread, with the finished
            :class:`Generation` or the exception that ended the request.
        cancelled: Returns True when nobody waits for the answer any more.
        on_token: Called from the worker thread with every sampled token, before the
            request is resolved: ``(token_id, logprob, top)``, where ``top`` holds the
            ``top_logprobs`` most likely ``(token_id, logprob)`` pairs of the distribution
            the token was drawn from (empty when ``top_logprobs`` is 0). For streaming.
        top_logprobs: How many alternatives ``on_token`` receives per token.
        ignore_eos: Keep decoding past end-of-sequence tokens, until ``max_new_tokens``
            or a stop string (benchmarks that need a known response length).
        response_ids: Sampled ids so far.
        logprobs: Their recorded log-probs.
        candidates: Constrained decoding: the token ids of every allowed response
            (:mod:`mage_rl.policy.constrained`); ``None`` samples freely.
        allowed: With ``candidates``, the allowed token ids of every sampled position.
        prefix_len: Leading tokens of the prompt whose keys and values are ready before
            its (next) prefill pass: reused from the prefix cache, or computed by earlier
            chunks of a chunked prefill.
        prefix: Their per-layer states (:data:`~mage_rl.policy.prefix_cache.LayerStates`).
        looked_up: Whether the prefix cache was consulted for this request.
    """

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    max_new_tokens: int
    resolve: Callable[[Generation | BaseException], None]
    cancelled: Callable[[], bool] = lambda: False
    on_token: Callable[[int, float, list[tuple[int, float]]], None] | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    candidates: list[list[int]] | None = None
    allowed: list[list[int]] = field(default_factory=list)
    prefix_len: int = 0
    prefix: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None
    looked_up: bool = False
    _text_len: int = 0

    def finish(self, finish_reason: str, text: str) -> None:
        """Resolve with the :class:`Generation` made of what was sampled."""
        self.resolve(
            Generation(
                text=text, prompt_ids=list(self.prompt_ids),
                response_ids=list(self.response_ids), logprobs=list(self.logprobs),
                finish_reason=finish_reason, allowed=[list(ids) for ids in self.allowed],
            )
        )  # fmt: skip


@dataclass
class DecodeStats:
    """Counters over the engine's lifetime, for logs, benchmarks and tests.

    Attributes:
        batches: Prefill passes: groups of requests prefilled together (a group that
            arrives while others decode joins them), and chunks of a chunked prefill.
        requests: Requests admitted.
        forward_passes: Model forward passes (one per prefill pass plus one per decode
            step).
        prompt_tokens: Real (unpadded) tokens prefilled: the prompts, and the tokens
            every choice of a constrained request starts with, less the reused ones.
        reused_tokens: Prompt tokens not prefilled: their keys and values came from the
            prefix cache.
        generated_tokens: Tokens sampled (a constrained request's shared leading tokens
            and the rest of its choice once only one is left are taken, not sampled).
        largest_batch: Most requests decoded together.
        steps: Sampling steps (one token drawn for every row in flight).
        step_rows: Rows over all sampling steps; ``step_rows / steps`` is the mean batch.
        cancelled: Requests dropped because nobody waited for them any more.
        failed: Requests ended by an error.
        compute_seconds: Wall time spent prefilling and decoding.
        static_copies: Times the running batch's cache was copied into the static
            decoder's buffers (a new batch, rows that left or joined, room to grow;
            :mod:`~mage_rl.policy.static_decode`).
        graph_captures: CUDA graphs of the decode step recorded.
        graph_steps: Decode steps replayed from a CUDA graph.
        graph_failures: Captures that failed (the decoder then runs eagerly).
    """

    batches: int = 0
    requests: int = 0
    forward_passes: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    generated_tokens: int = 0
    largest_batch: int = 0
    steps: int = 0
    step_rows: int = 0
    cancelled: int = 0
    failed: int = 0
    compute_seconds: float = 0.0
    static_copies: int = 0
    graph_captures: int = 0
    graph_steps: int = 0
    graph_failures: int = 0

    @property
    def mean_batch(self) -> float:
        """Mean rows sampled together per step."""
        return self.step_rows / max(self.steps, 1)


TokenCallback = Callable[[int, float, list[tuple[int, float]]], None]
"""``(token_id, logprob, top)`` for each sampled token; see :meth:`LocalEngine.generate_from_ids`."""


def threadsafe_callback(loop: asyncio.AbstractEventLoop, callback: TokenCallback) -> TokenCallback:
    """Wrap ``callback`` so that the worker thread runs it on ``loop``, in token order."""

    def call(token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        # RuntimeError: the loop closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, token, logprob, top)

    return call


def settle_threadsafe(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Generation],
    outcome: Generation | BaseException,
) -> None:
    """Hand ``outcome`` to ``future`` from the worker thread."""
    try:
        loop.call_soon_threadsafe(_settle, future, outcome)
    except RuntimeError:  # the loop closed; nobody is waiting any more
        logger.debug("dropping a response for a closed event loop")


def _settle(future: asyncio.Future[Generation], outcome: Generation | BaseException) -> None:
    """Resolve ``future`` on its loop's thread, once; later outcomes are ignored."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
