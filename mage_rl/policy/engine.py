"""A local transformers engine that batches concurrent chat requests continuously.

Many agent graphs run concurrently in one asyncio loop during rollouts, and many clients
call ``mage serve`` at once; each LLM call is one ``await engine.generate(...)``. Decoding
them one at a time would leave the CPU or GPU mostly idle, so the engine batches them:

1. ``generate`` renders the chat template, enqueues the request and awaits a future. The
   event loop is never blocked: all model compute runs on one worker thread.
2. When the worker is idle, it takes the first waiting request, then keeps collecting
   while requests keep arriving less than ``batch_wait_ms`` apart (a burst from
   ``asyncio.gather`` trickles in as each task renders its prompt), for at most
   ``10 * batch_wait_ms`` in all, or until ``max_batch_size``.
3. The collected requests are prefilled together and decoded in a running batch
   (:class:`~mage_rl.policy.decoding.RunningBatch`): one forward pass per decode step for
   all its sequences, each sequence leaving when it ends and its future resolved at once.
4. Continuous batching: before every decode step the worker admits whatever arrived
   meanwhile (up to ``max_batch_size`` rows): the newcomers are prefilled and join the
   running batch, so a short request never waits for a long one to finish.
5. Cancellation: a request whose awaiting task is cancelled (a client that hung up)
   leaves the batch before its next token is drawn, so nobody pays for abandoned work.
6. Prefix reuse and chunked prefill (:mod:`~mage_rl.policy.prefix_cache`,
   :mod:`~mage_rl.policy.prefill`): a prompt that starts like a sequence seen before (a
   shared system prompt, a conversation's earlier turns) prefills only its new tokens,
   and a prompt longer than ``prefill_tokens`` is prefilled a chunk per step, so the
   running requests keep decoding and short newcomers join meanwhile.

Weights: every response is sampled from a single set of weights. The rule:
:meth:`LocalEngine.update_weights` stops admissions, waits until the running batch is
empty (requests in flight finish with the old weights), swaps the weights between two
steps while no forward pass runs, then lets the waiting requests in. Weight updates come
between rollout phases, so the wait is normally nil.

Reproducibility: every request has its own ``torch.Generator``, seeded from
``SamplingParams.seed`` or, when that is ``None``, from the engine's seeded stream in
arrival order. The random draws therefore do not depend on the batch a request lands in
nor on when it joins. The logits can: padding and batch shape change floating-point
reduction order in the last bits, which can flip a draw in rare cases, and so can a
reused prefix or a chunk boundary (a prefill over other tokens). The same requests in the
same order give bitwise-identical output; another batch composition or cache state gives
the same output almost always.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mage_rl.policy.asyncutil import run_sync
from mage_rl.policy.base import Generation, Message, RequestRejected, SamplingParams
from mage_rl.policy.constrained import ChoiceCache, choice_token_ids
from mage_rl.policy.decoding import RunningBatch
from mage_rl.policy.prefix_cache import DEFAULT_MAX_ENTRIES, PrefixCache
from mage_rl.policy.requests import (
    DecodeRequest,
    DecodeStats,
    TokenCallback,
    settle_threadsafe,
    threadsafe_callback,
)
from mage_rl.policy.static_decode import resolve_static_decode
from mage_rl.policy.tokenization import eos_token_ids as default_eos_ids
from mage_rl.policy.tokenization import max_chars_per_token, render_within
from mage_rl.policy.weights import load_weights

logger = logging.getLogger(__name__)

_SHUTDOWN = object()


class EngineClosedError(RuntimeError):
    """Raised for requests made to, or still waiting in, a closed engine."""


class LocalEngine:
    """In-process :class:`~mage_rl.policy.base.Policy` over a transformers causal LM.

    Args:
        model: A causal LM (``Qwen3ForCausalLM``, ``LlamaForCausalLM``, ...). The engine
            puts it in eval mode.
        tokenizer: Its tokenizer; must have a ``chat_template``.
        max_batch_size: Most requests decoded together.
        batch_wait_ms: When idle, how long the worker waits for one more request before
            it starts decoding (the whole collection lasts at most ten times this). Longer
            gives a bigger first prefill under bursty load, at the cost of latency for a
            lone request; requests arriving later join the running batch anyway.
        batched: ``False`` decodes requests one at a time (``max_batch_size=1``, no
            wait), the baseline for benchmarks.
        seed: Seed of the stream that seeds requests without their own ``seed``.
        eos_token_ids: Ids that end a response; default from the tokenizer and the
            model's generation config (see
            :func:`~mage_rl.policy.tokenization.eos_token_ids`).
        name: Policy name reported in logs and chat-model metadata.
        prefix_cache_mb: Memory for the keys and values of earlier sequences, whose
            prefixes later prompts reuse instead of prefilling them again (shared system
            prompts, a conversation's earlier turns; see
            :mod:`~mage_rl.policy.prefix_cache`); 0 turns reuse off.
        prefix_cache_entries: Most sequences kept for reuse (0 turns reuse off). With
            small models this, not ``prefix_cache_mb``, is the bound that binds: a
            server's memory grows under ordinary load until the cache holds this many.
        prefill_tokens: Most prompt tokens prefilled in one forward pass. A longer
            prompt is prefilled in chunks, with a decode step of the running requests
            between two chunks, so they keep streaming; smaller chunks mean smoother
            latency for them and more passes for the long prompt.
        static_decode: Decode steps over a cache grown a column a step (``"off"``), over
            preallocated buffers (``"eager"``), or over those replayed as CUDA graphs
            (``"graphs"``; :mod:`~mage_rl.policy.static_decode`); ``"auto"``: graphs on CUDA.

    Attributes:
        model: The model being sampled from; the learner may read it.
        tokenizer: The tokenizer.
        prefix_cache: The stored sequences (``None`` when reuse is off).
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
        prefix_cache_mb: float = 1024,
        prefill_tokens: int = 512,
        prefix_cache_entries: int = DEFAULT_MAX_ENTRIES,
        static_decode: str = "auto",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if prefix_cache_mb < 0 or prefill_tokens < 1 or prefix_cache_entries < 0:
            raise ValueError(
                f"prefix_cache_mb={prefix_cache_mb}, prefill_tokens={prefill_tokens}, "
                f"prefix_cache_entries={prefix_cache_entries}: give prefix_cache_mb >= 0 and "
                "prefix_cache_entries >= 0 (0 turns prefix reuse off) and prefill_tokens >= 1"
            )
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
        self.prefix_cache = (
            PrefixCache(int(prefix_cache_mb * 2**20), max_entries=prefix_cache_entries)
            if prefix_cache_mb > 0 and prefix_cache_entries > 0
            else None
        )
        self.prefill_tokens = prefill_tokens
        self._device = next(model.parameters()).device
        self.static_decode = resolve_static_decode(static_decode, self._device)
        self._seeds = random.Random(seed)
        self._seed_lock = threading.Lock()
        # Weight updates and busy periods exclude each other (see the module docstring).
        self._state = threading.Condition()
        self._busy = False
        self._updates_waiting = 0
        self._update_lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self.choice_cache = ChoiceCache()
        self._token_chars: list[int | None] = []  # max_chars_per_token, once known

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
            RequestRejected: If the rendered prompt does not fit in the model's context.
            EngineClosedError: If the engine was closed.
        """
        params = params or SamplingParams()
        if params.seed is None:  # drawn in call order, whichever render finishes first
            params = replace(params, seed=self._draw_seed())
        # Rendering and tokenizing a long chat takes a while: off the event loop.
        prompt = await asyncio.to_thread(self._render, messages)
        return await self.generate_from_ids(prompt, params)

    async def generate_from_ids(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        on_token: TokenCallback | None = None,
        top_logprobs: int = 0,
        ignore_eos: bool = False,
    ) -> Generation:
        """Sample one response to already rendered prompt ids (see :meth:`generate`).

        Cancelling the task that awaits this call aborts the request: it leaves the batch
        before its next token is drawn.

        Args:
            prompt_ids: The rendered prompt.
            params: Sampling parameters.
            on_token: Called on the event loop with ``(token_id, logprob, top)`` for every
                sampled token as it is drawn, before the response is returned (streaming).
                ``top`` lists the ``top_logprobs`` most likely ``(token_id, logprob)``
                pairs of the sampling distribution.
            top_logprobs: Alternatives per token handed to ``on_token`` (0 for none).
            ignore_eos: Keep decoding past end-of-sequence tokens (to ``max_tokens`` or a
                stop string); for benchmarks that need responses of a known length.
        """
        params = params or SamplingParams()
        if top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {top_logprobs}")
        if len(prompt_ids) >= self.max_context:  # before copying: it may be huge
            raise RequestRejected(
                f"prompt of {len(prompt_ids)} tokens leaves no room in the model's context "
                f"of {self.max_context} tokens; shorten the chat (e.g. fewer reflections)"
            )
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: the model needs at least one token")
        room = self.max_context - len(prompt)
        if room < 1:
            raise RequestRejected(
                f"prompt of {len(prompt)} tokens leaves no room in the model's context of "
                f"{self.max_context} tokens; shorten the chat (e.g. fewer reflections)"
            )
        candidates = self.choice_cache.get(params.choices) if params.choices else None
        fresh = bool(params.choices) and candidates is None
        if fresh:  # a thousand long choices take a second to tokenize: off the loop
            try:
                candidates = await asyncio.to_thread(
                    choice_token_ids, self.tokenizer, params.choices
                )
            except ValueError as error:
                raise RequestRejected(str(error)) from None
        max_new = min(params.max_tokens, room)
        if candidates is not None:
            # A constrained response ends when it equals a choice; max_tokens does not cut it.
            max_new = max(len(c) for c in candidates)
            if max_new > room:
                raise RequestRejected(
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
            resolve=lambda outcome: settle_threadsafe(loop, future, outcome),
            cancelled=future.cancelled,
            on_token=threadsafe_callback(loop, on_token) if on_token else None,
            top_logprobs=top_logprobs,
            ignore_eos=ignore_eos,
        )
        self._submit(request)
        generation = await future
        if fresh:  # only choices of a request that succeeded are kept
            self.choice_cache.put(params.choices, candidates)  # type: ignore[arg-type]
        return generation

    def generate_sync(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Blocking :meth:`generate`, usable with or without a running event loop."""
        return run_sync(self.generate(messages, params))

    def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], *, strict: bool = True
    ) -> None:
        """Load new weights into :attr:`model` in place.

        Stops admitting requests and waits for the running batch to empty, so every
        response is sampled from one set of weights; requests that arrive meanwhile wait
        and are served with the new weights. Blocks the caller; from async code use ``await asyncio.to_thread(engine.update_weights, sd)``.

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
        with self._update_lock:
            with self._state:
                self._updates_waiting += 1
                while self._busy:
                    self._state.wait()
            try:
                load_weights(self.model, state_dict, strict=strict)
                self.weight_version += 1
                if self.prefix_cache is not None:  # computed with the old weights
                    self.prefix_cache.clear()
            finally:
                with self._state:
                    self._updates_waiting -= 1
                    self._state.notify_all()
        logger.info("engine %s loaded weights version %d", self.name, self.weight_version)

    def close(self) -> None:
        """Stop the worker thread; waiting and later requests get :class:`EngineClosedError`.
        The stored prefixes are dropped (they can take a gigabyte)."""
        with self._start_lock:
            self._closed = True
            worker = self._worker
        if worker is not None:
            self._queue.put(_SHUTDOWN)
            worker.join()
        self._fail_pending()
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _render(self, messages: list[Message]) -> list[int]:
        if not self._token_chars:
            self._token_chars.append(max_chars_per_token(self.tokenizer))
        return render_within(self.tokenizer, messages, self.max_context, self._token_chars[0])

    def _draw_seed(self) -> int:
        with self._seed_lock:
            return self._seeds.getrandbits(63)

    def _generator(self, seed: int | None) -> torch.Generator:
        if seed is None:
            seed = self._draw_seed()
        generator = torch.Generator(device=self._device)
        # torch takes seeds modulo 2**64 (a negative seed wraps); outside that range it
        # raises, so a seed + choice index past int64 wraps the same way instead.
        generator.manual_seed(int(seed) % (1 << 64))
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
        """Worker thread: run the loop; should it fail, close the engine and answer all."""
        batch = RunningBatch(
            self.model, self.tokenizer, pad_id=self.pad_id, eos_ids=self.eos_ids,
            stats=self.stats, prefix_cache=self.prefix_cache, prefill_tokens=self.prefill_tokens,
            static_decode=self.static_decode,
        )  # fmt: skip
        waiting: deque[DecodeRequest] = deque()
        try:
            self._loop(batch, waiting)
        except BaseException as error:  # a bug here must not leave callers waiting forever
            logger.exception("engine %s worker stopped", self.name)
            with self._start_lock:
                self._closed = True
            for request in [*batch.requests(), *waiting]:
                request.resolve(EngineClosedError(f"engine {self.name!r} failed: {error!r}"))
            self._fail_pending()
            self._set_busy(False)

    def _loop(self, batch: RunningBatch, waiting: deque[DecodeRequest]) -> None:
        """Admit waiting requests, run one decode step, repeat until shutdown."""
        shutdown = False
        while True:
            if not batch:
                self._set_busy(False)
                if shutdown:
                    self._fail(waiting)
                    return
                if not waiting:
                    item = self._queue.get()
                    if item is _SHUTDOWN:
                        return
                    waiting.append(item)  # type: ignore[arg-type]
                shutdown = self._collect(waiting)
                self._set_busy(True)
            else:
                shutdown = self._take_arrivals(waiting) or shutdown
            admit = self._admissible(waiting, len(batch), stop=shutdown)
            if admit and batch.can_admit():
                batch.admit(admit)
            else:
                waiting.extendleft(reversed(admit))
            if batch:
                batch.step()

    def _collect(self, waiting: deque[DecodeRequest]) -> bool:
        """Gather a burst of requests into ``waiting`` (idle worker); True on shutdown."""
        hard_deadline = time.monotonic() + 10 * self.batch_wait_s
        while len(waiting) < self.max_batch_size:
            timeout = min(self.batch_wait_s, hard_deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=max(0.0, timeout))
            except queue.Empty:
                return False
            if item is _SHUTDOWN:
                return True
            waiting.append(item)  # type: ignore[arg-type]
        return False

    def _take_arrivals(self, waiting: deque[DecodeRequest]) -> bool:
        """Move what arrived during the last step into ``waiting``; True on shutdown."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _SHUTDOWN:
                return True
            waiting.append(item)  # type: ignore[arg-type]

    def _admissible(
        self, waiting: deque[DecodeRequest], running: int, *, stop: bool
    ) -> list[DecodeRequest]:
        """Pop the waiting requests that may join now, oldest first.

        None while a weight update waits (it needs the batch to empty) or after
        shutdown; at most ``max_batch_size - running``.
        """
        if stop or (running and self._updates_waiting):
            return []
        admit = []
        while waiting and running + len(admit) < self.max_batch_size:
            request = waiting.popleft()
            if request.cancelled():
                self.stats.cancelled += 1
            else:
                admit.append(request)
        return admit

    def _set_busy(self, busy: bool) -> None:
        """Enter or leave a busy period; entering waits for pending weight updates."""
        with self._state:
            if busy:
                while self._updates_waiting:
                    self._state.wait()
            self._busy = busy
            self._state.notify_all()

    def _fail(self, waiting: deque[DecodeRequest]) -> None:
        for request in waiting:
            request.resolve(EngineClosedError(f"engine {self.name!r} closed before answering"))
        waiting.clear()

    def _fail_pending(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, DecodeRequest):
                item.resolve(EngineClosedError(f"engine {self.name!r} closed before answering"))
