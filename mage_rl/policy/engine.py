"""A local transformers engine that batches concurrent chat requests.

Many agent graphs run concurrently in one asyncio loop during rollouts; each LLM call is
one ``await engine.generate(...)``. Decoding them one at a time would leave the CPU or GPU
mostly idle, so the engine batches them:

1. ``generate`` renders the chat template, enqueues the request and awaits a future. The
   event loop is never blocked: all model compute runs on one worker thread.
2. The worker takes the first waiting request, then keeps collecting while requests
   keep arriving less than ``batch_wait_ms`` apart (a burst from ``asyncio.gather``
   trickles in as each task renders its prompt), for at most ``10 * batch_wait_ms`` in
   all, or until ``max_batch_size``. Requests that queued up while the previous batch
   ran are taken at once.
3. The batch is decoded together (:func:`~mage_rl.policy.decoding.decode_batch`): one
   forward pass per decode step for all its sequences, each sequence leaving when it ends
   and its future resolved right away.
4. A request that arrives while a batch runs waits for the next batch (static batching):
   simple, and every response is sampled from a single set of weights, because
   :meth:`LocalEngine.update_weights` waits for the running batch to end.

Reproducibility: every request has its own ``torch.Generator``, seeded from
``SamplingParams.seed`` or, when that is ``None``, from the engine's seeded stream in
arrival order. The random draws therefore do not depend on the batch a request lands in.
The logits can: padding and batch shape change floating-point reduction order in the last
bits, which can flip a draw in rare cases. Same seed and same batch composition give
bitwise-identical output; a different composition gives the same output almost always.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mage_rl.policy.asyncutil import run_sync
from mage_rl.policy.base import Generation, Message, SamplingParams
from mage_rl.policy.constrained import choice_token_ids
from mage_rl.policy.decoding import DecodeRequest, DecodeStats, decode_batch
from mage_rl.policy.tokenization import eos_token_ids as default_eos_ids
from mage_rl.policy.tokenization import render_prompt

logger = logging.getLogger(__name__)

_SHUTDOWN = object()

TokenCallback = Callable[[int, float, list[tuple[int, float]]], None]
"""``(token_id, logprob, top)`` for each sampled token; see :meth:`LocalEngine.generate_from_ids`."""


class EngineClosedError(RuntimeError):
    """Raised for requests made to, or still waiting in, a closed engine."""


class LocalEngine:
    """In-process :class:`~mage_rl.policy.base.Policy` over a transformers causal LM.

    Args:
        model: A causal LM (``Qwen3ForCausalLM``, ``LlamaForCausalLM``, ...). The engine
            puts it in eval mode.
        tokenizer: Its tokenizer; must have a ``chat_template``.
        max_batch_size: Most requests decoded together.
        batch_wait_ms: How long the worker waits for one more request before closing a
            batch (the whole collection lasts at most ten times this). Longer gives bigger
            batches under bursty load, at the cost of latency for a lone request.
        batched: ``False`` decodes requests one at a time (``max_batch_size=1``, no
            wait), the baseline for benchmarks.
        seed: Seed of the stream that seeds requests without their own ``seed``.
        eos_token_ids: Ids that end a response; default from the tokenizer and the
            model's generation config (see
            :func:`~mage_rl.policy.tokenization.eos_token_ids`).
        name: Policy name reported in logs and chat-model metadata.

    Attributes:
        model: The model being sampled from; the learner may read it.
        tokenizer: The tokenizer.
        weight_version: Incremented by every :meth:`update_weights`.
        stats: Lifetime counters (batches, forward passes, tokens).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 32,
        batch_wait_ms: float = 5.0,
        batched: bool = True,
        seed: int = 0,
        eos_token_ids: Sequence[int] | None = None,
        name: str | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size if batched else 1
        self.batch_wait_s = batch_wait_ms / 1000 if batched else 0.0
        self.name = name or str(getattr(model.config, "name_or_path", "") or "local")
        self.eos_ids = (
            set(eos_token_ids)
            if eos_token_ids is not None
            else default_eos_ids(tokenizer, getattr(model, "generation_config", None))
        )
        if not self.eos_ids:
            raise ValueError("eos_token_ids is empty: responses could only end by length")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.eos_ids)
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.weight_version = 0
        self.stats = DecodeStats()
        self._device = next(model.parameters()).device
        self._seeds = random.Random(seed)
        self._seed_lock = threading.Lock()
        # Held by the worker for a whole batch, so new weights never land mid-response.
        self._weights_lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self._choices_cache: dict[tuple[str, ...], list[list[int]]] = {}

    async def generate(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Sample one response to a chat.

        Args:
            messages: ``{"role", "content"}`` dicts; the chat template is applied with
                ``add_generation_prompt=True``.
            params: Sampling parameters (defaults: ``SamplingParams()``).

        Returns:
            The response with its prompt ids, response ids and sampling log-probs.

        Raises:
            ValueError: If the rendered prompt does not fit in the model's context.
            EngineClosedError: If the engine was closed.
        """
        return await self.generate_from_ids(render_prompt(self.tokenizer, messages), params)

    async def generate_from_ids(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        on_token: TokenCallback | None = None,
        top_logprobs: int = 0,
    ) -> Generation:
        """Sample one response to already rendered prompt ids (see :meth:`generate`).

        Args:
            prompt_ids: The rendered prompt.
            params: Sampling parameters.
            on_token: Called on the event loop with ``(token_id, logprob, top)`` for every
                sampled token as it is drawn, before the response is returned (streaming).
                ``top`` lists the ``top_logprobs`` most likely ``(token_id, logprob)``
                pairs of the sampling distribution.
            top_logprobs: Alternatives per token handed to ``on_token`` (0 for none).
        """
        params = params or SamplingParams()
        if top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {top_logprobs}")
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: the model needs at least one token")
        room = self.max_context - len(prompt)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt)} tokens leaves no room in the model's context of "
                f"{self.max_context} tokens; shorten the chat (e.g. fewer reflections)"
            )
        candidates = self._choice_ids(params.choices) if params.choices else None
        max_new = min(params.max_tokens, room)
        if candidates is not None:
            # A constrained response ends when it equals a choice; max_tokens does not cut it.
            max_new = max(len(c) for c in candidates)
            if max_new > room:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens leaves {room} tokens in the model's "
                    f"context, fewer than the longest choice ({max_new} tokens)"
                )
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        request = DecodeRequest(
            prompt_ids=prompt,
            params=params,
            generator=self._generator(params.seed),
            max_new_tokens=max_new,
            candidates=candidates,
            resolve=lambda outcome: _settle_threadsafe(loop, future, outcome),
            cancelled=future.cancelled,
            on_token=_threadsafe_callback(loop, on_token) if on_token else None,
            top_logprobs=top_logprobs,
        )
        self._submit(request)
        return await future

    def generate_sync(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Blocking :meth:`generate`, usable with or without a running event loop."""
        return run_sync(self.generate(messages, params))

    def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        """Load new weights into :attr:`model` in place.

        Waits for the running batch to finish, so every response is sampled from one set
        of weights; requests that arrive meanwhile are served with the new weights. Blocks
        the caller; from async code use ``await asyncio.to_thread(engine.update_weights, sd)``.

        Args:
            state_dict: Parameter tensors by name, in any dtype and on any device; each is
                cast to the dtype and device of the parameter it replaces (a learner may
                train in fp32 while the engine samples in bf16).
            strict: Require every parameter to be present (weights tied to a given one,
                such as ``lm_head`` tied to the embeddings, may be left out) and no unknown
                name.

        Raises:
            KeyError: On unknown or (with ``strict``) missing parameter names.
        """
        with self._weights_lock:
            load_weights(self.model, state_dict, strict=strict)
            self.weight_version += 1
        logger.info("engine %s loaded weights version %d", self.name, self.weight_version)

    def close(self) -> None:
        """Stop the worker thread; waiting and later requests get :class:`EngineClosedError`."""
        with self._start_lock:
            self._closed = True
            worker = self._worker
        if worker is not None:
            self._queue.put(_SHUTDOWN)
            worker.join()
        self._fail_pending()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _choice_ids(self, choices: tuple[str, ...]) -> list[list[int]]:
        """Token ids of constrained-decoding choices, tokenized once per distinct set."""
        cached = self._choices_cache.get(choices)
        if cached is None:
            cached = choice_token_ids(self.tokenizer, choices)
            if len(self._choices_cache) >= 1024:
                self._choices_cache.clear()
            self._choices_cache[choices] = cached
        return cached

    def _generator(self, seed: int | None) -> torch.Generator:
        if seed is None:
            with self._seed_lock:
                seed = self._seeds.getrandbits(63)
        generator = torch.Generator(device=self._device)
        generator.manual_seed(seed)
        return generator

    def _submit(self, request: DecodeRequest) -> None:
        with self._start_lock:
            if self._closed:
                raise EngineClosedError(f"engine {self.name!r} is closed")
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name=f"mage-engine-{self.name}", daemon=True
                )
                self._worker.start()
            self._queue.put(request)

    def _run(self) -> None:
        """Worker loop: collect a batch, decode it, repeat until shutdown."""
        while True:
            first = self._queue.get()
            if first is _SHUTDOWN:
                return
            batch = [first]
            hard_deadline = time.monotonic() + 10 * self.batch_wait_s
            shutdown = False
            while len(batch) < self.max_batch_size:
                timeout = min(self.batch_wait_s, hard_deadline - time.monotonic())
                try:
                    item = self._queue.get(timeout=max(0.0, timeout))
                except queue.Empty:
                    break
                if item is _SHUTDOWN:
                    shutdown = True
                    break
                batch.append(item)
            requests = [r for r in batch if isinstance(r, DecodeRequest) and not r.cancelled()]
            if requests:
                with self._weights_lock:
                    decode_batch(
                        self.model,
                        self.tokenizer,
                        requests,
                        pad_id=self.pad_id,
                        eos_ids=self.eos_ids,
                        stats=self.stats,
                    )
            if shutdown:
                return

    def _fail_pending(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, DecodeRequest):
                item.resolve(EngineClosedError(f"engine {self.name!r} closed before answering"))


def load_weights(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True
) -> None:
    """Copy ``state_dict`` into ``model``'s parameters, casting dtype and device.

    Args:
        model: The model to update in place.
        state_dict: New tensors by parameter or buffer name.
        strict: Require all parameters (tied duplicates excepted) and no unknown names.

    Raises:
        KeyError: On unknown names, or missing ones with ``strict``.
    """
    own = model.state_dict()
    unknown = sorted(set(state_dict) - set(own))
    if unknown:
        raise KeyError(f"update_weights got names the model does not have: {unknown[:5]}")
    if strict:
        # A tied weight is one tensor under two names; providing either name suffices.
        by_storage: dict[int, set[str]] = {}
        for name, tensor in own.items():
            by_storage.setdefault(tensor.data_ptr(), set()).add(name)
        missing = sorted(
            name
            for name, tensor in own.items()
            if name not in state_dict and not (by_storage[tensor.data_ptr()] & set(state_dict))
        )
        if missing:
            raise KeyError(f"update_weights is missing {len(missing)} tensors: {missing[:5]}")
    with torch.no_grad():
        for name, tensor in state_dict.items():
            target = own[name]
            target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))


def _threadsafe_callback(loop: asyncio.AbstractEventLoop, callback: TokenCallback) -> TokenCallback:
    """Wrap ``callback`` so that the worker thread runs it on ``loop``, in token order."""

    def call(token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        # RuntimeError: the loop closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, token, logprob, top)

    return call


def _settle_threadsafe(
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
