"""Continuous batching: the sequences being decoded share forward passes and a KV cache.

Everything here runs on the engine's worker thread and never touches an event loop. A
:class:`RunningBatch` holds the sequences in flight and their key/value cache:

1. Admission (:meth:`RunningBatch.admit`) queues the newcomers. A constrained request's
   prompt is followed by the tokens all its choices share (:mod:`~mage_rl.policy.forced`):
   one allowed value each, log-prob 0, no decode step of their own.
2. Prefill, at the start of every step (:mod:`mage_rl.policy.prefill`): each queued
   prompt first takes the longest stored prefix it shares with an earlier sequence
   (:mod:`mage_rl.policy.prefix_cache`); requests that arrived together and share more
   than that get their common prefixes prefilled once first (:func:`shared_prefixes`),
   where that costs fewer padded tokens; then, within ``prefill_tokens`` tokens, the
   requests that fit are prefilled together in one forward pass (left-padded,
   ``position_ids`` counting real tokens only, so each row sees exactly what it would
   see alone), and a longer prompt gets one chunk of its own. The prefilled group's
   cache joins the running one: the shorter of the two is left-padded with masked zero
   columns and the rows are concatenated, so a request joins a running decode loop at
   the next step instead of waiting for it to end.
3. Step (:meth:`RunningBatch.step`): sample one token per row from its pending logits
   (:mod:`mage_rl.policy.sampling`, each row with its own generator), check EOS, stop
   strings and the length limit, answer the rows that ended (and store their sequence
   in the prefix cache: a conversation's next call continues it), drop them with their
   cache rows (and the leading cache columns no remaining row attends to), and run ONE
   forward pass over ``(B, 1)`` for the rest (on a GPU, a CUDA graph replayed over
   fixed buffers: :mod:`mage_rl.policy.static_decode`). A cancelled request leaves
   before the next sample.
4. Isolation: a row's sampling, callback and end checks failing settle only its own
   request; a failed forward pass fails its rows (no partial result to keep).

Merging needs full-attention cache layers (``DynamicLayer``); for a model with sliding
window layers :attr:`RunningBatch.mergeable` is False: newcomers wait until the batch is
empty (static batching), and prefixes are neither reused nor prefilled in chunks.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from mage_rl.policy.constrained import allowed_next, is_complete, restricted_logprobs
from mage_rl.policy.forced import complete_forced, take_forced
from mage_rl.policy.prefill import (
    pad_mask,
    pad_time,
    prefill_group,
    remaining,
    row_states,
    sequence,
)
from mage_rl.policy.prefix_cache import PrefixCache, common_prefix
from mage_rl.policy.requests import DecodeRequest, DecodeStats
from mage_rl.policy.sampling import draw_rows, sampling_logprobs
from mage_rl.policy.static_decode import StaticDecoder
from mage_rl.policy.tokenization import find_stop

logger = logging.getLogger(__name__)


class RunningBatch:
    """The sequences in flight, their shared KV cache and their pending logits.

    Args:
        model: A causal LM that accepts ``past_key_values``, ``attention_mask``,
            ``position_ids`` and ``logits_to_keep``.
        tokenizer: Decodes response ids into text.
        pad_id: Id used for left padding (masked out, so its value does not matter).
        eos_ids: Ids that end a response; the EOS token is kept in ``response_ids``.
        stats: Counters updated in place.
        prefix_cache: Where prefilled and finished sequences are stored and prompts look
            up reusable prefixes; ``None`` prefills every prompt whole.
        prefill_tokens: Most tokens prefilled in one forward pass; a longer prompt is
            prefilled in chunks of this size, one per step.
        static_decode: ``"off"`` (a growing cache), ``"eager"`` or ``"graphs"`` (fixed
            buffers, CUDA graphs; :mod:`~mage_rl.policy.static_decode`); full attention only.

    Attributes:
        rows: The requests being decoded, one per cache row.
        queued: Admitted requests waiting for (the rest of) their prefill.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        pad_id: int,
        eos_ids: set[int],
        stats: DecodeStats,
        prefix_cache: PrefixCache | None = None,
        prefill_tokens: int = 512,
        static_decode: str = "off",
    ) -> None:
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        if static_decode not in ("off", "eager", "graphs"):
            raise ValueError(f"static_decode must be off, eager or graphs, not {static_decode!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        self.stats = stats
        self.device = next(model.parameters()).device
        layers = DynamicCache(config=model.config).layers
        self.mergeable = all(type(layer) is DynamicLayer for layer in layers)
        # Sliding-window layers drop old columns: their states can be neither merged,
        # reused, nor built up chunk by chunk.
        self.prefix_cache = prefix_cache if self.mergeable else None
        self.prefill_tokens = prefill_tokens if self.mergeable else 1 << 62
        self.static = (
            StaticDecoder(model, stats, graphs=static_decode == "graphs")
            if static_decode != "off" and self.mergeable
            else None
        )
        self.queued: deque[DecodeRequest] = deque()
        self._reset()

    def __len__(self) -> int:
        return len(self.rows) + len(self.queued)

    def requests(self) -> list[DecodeRequest]:
        """Every request in the batch: decoding, then waiting for prefill."""
        return [*self.rows, *self.queued]

    def can_admit(self) -> bool:
        """Whether newcomers can join now (always, unless the cache cannot be merged)."""
        return not self or self.mergeable

    def admit(self, requests: list[DecodeRequest]) -> None:
        """Queue ``requests`` for prefill; the next :meth:`step` prefills them (within
        the token budget) and they sample in that step."""
        self.stats.requests += len(requests)
        for request in requests:
            # Tokens every allowed choice shares go into the prefill with the prompt.
            if not self._isolated(request, self._force_prefix, request, failed=True):
                self.queued.append(request)

    def step(self) -> None:
        """Sample one token for every row, answer those that ended, decode the rest."""
        if self.queued and (self.mergeable or not self.rows):
            self._prefill_queued()
        start = time.perf_counter()
        try:
            self._keep([i for i, r in enumerate(self.rows) if not self._dropped(r)])
            if not self.rows:
                return
            self.stats.steps += 1
            self.stats.step_rows += len(self.rows)
            with torch.inference_mode():
                drawn, logp = self._sample()
                self.stats.generated_tokens += len(drawn)
                self._report(drawn, logp)
                keep, finished = [], []
                for i, (token, lp) in drawn.items():
                    ended = self._isolated(
                        self.rows[i], self._advance, self.rows[i], token, lp, failed=None
                    )
                    (keep if ended is False else finished if ended else []).append(i)
                for i in finished:
                    self._store(i, sequence(self.rows[i]))
                tokens = [drawn[i][0] for i in keep]
                self._keep(keep)
                if self.rows:
                    self._decode(torch.tensor(tokens, dtype=torch.long, device=self.device))
        except BaseException as error:  # a forward pass failed: answer every row in it
            logger.exception("decode step of %d requests failed", len(self.rows))
            for request in self.rows:
                self._fail(request, error)
            self._reset()
            if not isinstance(error, Exception):
                raise
        finally:
            self.stats.compute_seconds += time.perf_counter() - start

    # -- internals -------------------------------------------------------------------

    def _reset(self) -> None:
        self.rows: list[DecodeRequest] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)  # (B, L)
        self.next_position = torch.zeros(0, dtype=torch.long, device=self.device)  # (B,)
        self.logits: torch.Tensor | None = None  # (B, V): each row's next-token logits
        self.temperature = torch.zeros(0, device=self.device)  # (B,)
        self.top_k = torch.zeros(0, dtype=torch.long, device=self.device)  # (B,)
        self.top_p = torch.zeros(0, device=self.device)  # (B,)

    def _prefill_queued(self) -> None:
        """Prefill queued requests within ``prefill_tokens`` tokens for this step.

        Requests that fit whole are prefilled together, oldest first, and join the
        batch. A request longer than the budget is prefilled in chunks, one per step,
        and gets at least half of the budget; short requests that come after it take
        the rest, so they do not wait for the whole long prefill.
        """
        start = time.perf_counter()
        budget = self.prefill_tokens
        arrived = []
        for request in list(self.queued):
            if self._dropped(request):
                self.queued.remove(request)
            elif not request.looked_up:
                self._look_up(request)
                arrived.append(request)
        if len(arrived) > 1 and self.prefix_cache is not None:
            self._prefill_shared(arrived)
        long = next((r for r in self.queued if remaining(r) > budget), None)
        room = budget - budget // 2 if long is not None else budget
        group: list[DecodeRequest] = []
        for request in self.queued:
            need = remaining(request)
            if request is not long and need <= room:
                group.append(request)
                room -= need
                budget -= need
        for request in group:
            self.queued.remove(request)
        try:
            if group:
                self._prefill_whole(group)
            if long is not None and budget > 0:
                self._prefill_chunk(long, budget)
        finally:
            self.stats.compute_seconds += time.perf_counter() - start

    def _look_up(self, request: DecodeRequest) -> None:
        request.looked_up = True
        if self.prefix_cache is None or not self.mergeable:
            return
        reused, states = self.prefix_cache.lookup(sequence(request))
        if reused:
            request.prefix_len, request.prefix = reused, states
            self.stats.reused_tokens += reused

    def _prefill_shared(self, arrived: list[DecodeRequest]) -> None:
        """Prefill what requests that arrived together share, once, before their own tails.

        :func:`shared_prefixes` groups them; one forward pass prefills each group's common
        prefix in one row (a request in no group gets a row for all but its last token),
        and every member takes its row's keys and values as a reused prefix. The pass
        that admits them then prefills a token or two per request instead of every
        request's whole prompt. It runs only where the two passes cost fewer padded
        tokens than one pass over the whole prompts would (for instance not when a
        single request shares nothing: its full width would pad every row anyway), and
        within ``prefill_tokens`` while other requests decode.
        """
        assert self.prefix_cache is not None
        plan = shared_prefixes(arrived, self.prefix_cache.min_tokens)
        end_of = {id(r): n for group, n in plan for r in group}
        plan += [([r], len(sequence(r)) - 1) for r in arrived
                 if id(r) not in end_of and remaining(r) > 1]  # fmt: skip
        if not plan:
            return
        end_of.update((id(group[0]), n) for group, n in plan if len(group) == 1)
        leaders = [max(group, key=lambda r: r.prefix_len) for group, _ in plan]
        ends = [n for _, n in plan]
        shared_width = max(n - r.prefix_len for r, n in zip(leaders, ends, strict=True))
        tail = max(len(sequence(r)) - end_of.get(id(r), r.prefix_len) for r in arrived)
        whole = max(remaining(r) for r in arrived)
        real = sum(n - r.prefix_len for r, n in zip(leaders, ends, strict=True))
        # Over the prefill budget only while nothing decodes: then nobody's next token
        # waits for this pass, and the tails that follow fit the budget together.
        if len(plan) * shared_width + len(arrived) * tail >= len(arrived) * whole or (
            self.rows and real > self.prefill_tokens
        ):
            return
        try:
            with torch.inference_mode():
                cache, mask, _ = prefill_group(self.model, leaders, ends, self.pad_id)
        except Exception:  # sharing is an optimisation: the requests prefill alone
            logger.warning("prefill of shared prefixes failed", exc_info=True)
            return
        self._count_prefill(leaders, ends)
        for row, (group, n) in enumerate(plan):
            states = row_states(cache, mask, row)
            for request in group:
                if request is not leaders[row]:
                    self.stats.reused_tokens += n - request.prefix_len
                request.prefix_len, request.prefix = n, states
            if len(group) > 1:
                self.prefix_cache.store(sequence(group[0])[:n], states)

    def _prefill_whole(self, group: list[DecodeRequest]) -> None:
        """Prefill the rest of every request in ``group`` in one pass; they join."""
        ends = [len(sequence(r)) for r in group]
        try:
            with torch.inference_mode():
                cache, mask, logits = prefill_group(self.model, group, ends, self.pad_id)
        except Exception as error:  # only the newcomers were in this forward pass
            logger.exception("prefill of %d requests failed", len(group))
            for request in group:
                self._fail(request, error)
            return
        self._count_prefill(group, ends)
        self._merge(group, cache, mask, mask.sum(-1), logits)
        self.stats.largest_batch = max(self.stats.largest_batch, len(self.rows))
        first = len(self.rows) - len(group)
        for row, request in enumerate(group):
            request.prefix = None  # the batch's cache holds them now
            self._store(first + row, sequence(request))

    def _prefill_chunk(self, request: DecodeRequest, tokens: int) -> None:
        """Prefill the next ``tokens`` tokens of ``request`` alone; it stays queued."""
        end = request.prefix_len + tokens
        try:
            with torch.inference_mode():
                cache, mask, _ = prefill_group(self.model, [request], [end], self.pad_id)
        except Exception as error:
            logger.exception("prefill chunk failed")
            self.queued.remove(request)
            self._fail(request, error)
            return
        self._count_prefill([request], [end])
        request.prefix, request.prefix_len = row_states(cache, mask, 0), end

    def _count_prefill(self, group: list[DecodeRequest], ends: list[int]) -> None:
        self.stats.batches += 1
        self.stats.forward_passes += 1
        self.stats.prompt_tokens += sum(e - r.prefix_len for r, e in zip(group, ends, strict=True))

    def _store(self, row: int, ids: list[int]) -> None:
        """Put row ``row``'s cached states (of ``ids``' first tokens) in the prefix cache.

        The last sampled token of a finished row never went through a forward pass: the
        row's mask counts the tokens whose states the cache holds.
        """
        if self.prefix_cache is None or self.cache is None:
            return
        try:
            states = row_states(self.cache, self.mask, row)
            self.prefix_cache.store(ids[: int(self.mask[row].sum())], states)
        except Exception:  # a cache is an optimisation: never fail a request for it
            logger.warning("storing a prefix failed", exc_info=True)

    def _merge(
        self,
        requests: list[DecodeRequest],
        cache: DynamicCache,
        mask: torch.Tensor,
        next_position: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Add a prefilled group to the batch, left-padding the shorter cache."""
        vocab = logits.shape[-1]
        # top_k >= V keeps every token, like 0; clamping keeps any huge value in int64.
        sampling = (
            torch.tensor([r.params.temperature for r in requests], device=self.device),
            torch.tensor([min(r.params.top_k, vocab) for r in requests], device=self.device),
            torch.tensor([r.params.top_p for r in requests], device=self.device),
        )
        if not self.rows:
            self.rows, self.cache, self.mask = list(requests), cache, mask
            self.next_position, self.logits = next_position, logits
            self.temperature, self.top_k, self.top_p = sampling
            return
        assert self.cache is not None and self.logits is not None
        width = max(self.mask.shape[1], mask.shape[1])
        for ours, theirs in zip(self.cache.layers, cache.layers, strict=True):
            if not getattr(theirs, "is_initialized", False):
                continue  # a layer that shares another's cache holds nothing of its own
            ours.keys = torch.cat([pad_time(ours.keys, width), pad_time(theirs.keys, width)])
            ours.values = torch.cat([pad_time(ours.values, width), pad_time(theirs.values, width)])
        self.mask = torch.cat([pad_mask(self.mask, width), pad_mask(mask, width)])
        self.next_position = torch.cat([self.next_position, next_position])
        self.logits = torch.cat([self.logits, logits])
        self.temperature = torch.cat([self.temperature, sampling[0]])
        self.top_k = torch.cat([self.top_k, sampling[1]])
        self.top_p = torch.cat([self.top_p, sampling[2]])
        self.rows += requests

    def _keep(self, keep: list[int]) -> None:
        """Keep only the rows ``keep`` (in order), and trim cache columns no row uses."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self._reset()
            return
        index = torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        assert self.cache is not None and self.logits is not None
        self.cache.batch_select_indices(index)
        self.mask, self.next_position = self.mask[index], self.next_position[index]
        self.logits = self.logits[index]
        self.temperature, self.top_k = self.temperature[index], self.top_k[index]
        self.top_p = self.top_p[index]
        # A long prompt that left the batch would otherwise keep every remaining row
        # attending over its padding for the rest of the loop.
        used = self.mask.any(0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0 and self.mergeable:
            for layer in self.cache.layers:
                if getattr(layer, "is_initialized", False):
                    layer.keys = layer.keys[:, :, first:]
                    layer.values = layer.values[:, :, first:]
            self.mask = self.mask[:, first:]

    def _sample(self) -> tuple[dict[int, tuple[int, float]], torch.Tensor]:
        """Draw a token per row (a constrained row from its restricted distribution); a
        row whose sampling fails is answered with the error. Returns ``{row: (token,
        logprob)}`` for the rows that drew and the ``(B, V)`` log-probs they drew from."""
        assert self.logits is not None
        logits = self.logits
        failed: set[int] = set()
        try:
            logp = sampling_logprobs(logits, self.temperature, self.top_k, self.top_p)
        except Exception:  # find the row at fault: the others must not pay for it
            logp = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
            for i, request in enumerate(self.rows):
                row = self._isolated(
                    request, sampling_logprobs, logits[i : i + 1], self.temperature[i : i + 1],
                    self.top_k[i : i + 1], self.top_p[i : i + 1], failed=None,
                )  # fmt: skip
                if row is None:
                    failed.add(i)
                else:
                    logp[i : i + 1] = row
        rows = [i for i, r in enumerate(self.rows) if i not in failed
                and self._isolated(r, self._restrict, i, logp, failed=False) is not False]  # fmt: skip
        outcomes = draw_rows(
            logp[rows], [self.rows[i].params.temperature == 0 for i in rows],
            [self.rows[i].generator for i in rows],
        )  # fmt: skip
        drawn: dict[int, tuple[int, float]] = {}
        for i, outcome in zip(rows, outcomes, strict=True):
            if isinstance(outcome, ValueError):
                self._fail(self.rows[i], outcome)
            else:
                drawn[i] = outcome
        return drawn, logp

    def _restrict(self, i: int, logp: torch.Tensor) -> None:
        """A constrained row's distribution: only tokens that continue an allowed choice."""
        assert self.logits is not None
        request, sp = self.rows[i], self.rows[i].params  # sp: its sampling params
        if request.candidates is not None:
            allowed = allowed_next(request.candidates, request.response_ids)
            logp[i] = restricted_logprobs(self.logits[i], sp.temperature, allowed, sp.explore)
            request.allowed.append(allowed)

    def _report(self, drawn: dict[int, tuple[int, float]], logp: torch.Tensor) -> None:
        """Hand each drawn token, with its top alternatives when asked, to ``on_token``."""
        rows = [i for i in drawn if self.rows[i].on_token is not None]
        if not rows:
            return
        k = max(self.rows[i].top_logprobs for i in rows)
        top_ids: list[list[int]] = [[] for _ in rows]
        top_lp: list[list[float]] = [[] for _ in rows]
        if k > 0:
            values, indices = torch.topk(logp[rows], min(k, logp.shape[-1]), dim=-1)  # (R, k)
            top_ids, top_lp = indices.tolist(), values.tolist()
        for j, i in enumerate(rows):
            request = self.rows[i]
            n = request.top_logprobs
            top = list(zip(top_ids[j][:n], top_lp[j][:n], strict=True))
            token, lp = drawn[i]
            if self._isolated(request, request.on_token, token, lp, top, failed=False) is False:
                del drawn[i]  # the callback failed: its request is answered with the error

    def _decode(self, tokens: torch.Tensor) -> None:
        """One forward pass over ``(B, 1)``: each row's last token, giving its next logits."""
        grown = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=-1)
        if self.static is not None:
            assert self.cache is not None
            self.logits = self.static.forward(self.cache, self.mask, tokens, self.next_position)
        else:
            self.logits = self.model(
                input_ids=tokens[:, None], attention_mask=grown,
                position_ids=self.next_position[:, None], past_key_values=self.cache,
                use_cache=True,
            ).logits[:, -1, :]  # (B, V)  # fmt: skip
        self.mask = grown  # (B, L + 1)
        self.next_position = self.next_position + 1
        self.stats.forward_passes += 1

    def _dropped(self, request: DecodeRequest) -> bool:
        """Whether a row leaves without an answer: nobody waits for it any more."""
        if request.cancelled():
            self.stats.cancelled += 1
            return True
        return False

    def _isolated(
        self, request: DecodeRequest, fn: Callable, *args: object, failed: object
    ) -> object:
        """``fn(*args)``; if it raises, answer ``request`` with the error, return ``failed``."""
        try:
            return fn(*args)
        except Exception as error:
            logger.warning("request failed in decoding: %r", error, exc_info=True)
            self._fail(request, error)
            return failed

    def _fail(self, request: DecodeRequest, error: BaseException) -> None:
        self.stats.failed += 1
        request.resolve(error)

    def _force_prefix(self, request: DecodeRequest) -> bool:
        """Append the tokens a constrained request must start with; True if that ends it.

        While only one token is allowed next, it is taken without a forward pass, with
        log-prob exactly 0 (the restricted distribution has one outcome), and reported to
        ``on_token`` like a drawn token. A single allowed choice is answered whole here. A
        request cancelled while it queued leaves here too.
        """
        if self._dropped(request):
            return True
        if request.candidates is None:
            return False
        for token in take_forced(request):
            if request.on_token is not None:
                request.on_token(token, 0.0, [(token, 0.0)][: request.top_logprobs])
        if not is_complete(request.candidates, request.response_ids):
            return False
        request.finish("stop", _decode(self.tokenizer, request.response_ids))
        return True

    def _advance(self, request: DecodeRequest, token: int, logprob: float) -> bool:
        """Append one sampled token; answer the request and return True if it is finished."""
        request.response_ids.append(token)
        request.logprobs.append(logprob)
        finish_reason: str | None = None
        text: str | None = None
        if token in self.eos_ids and not request.ignore_eos:
            finish_reason = "stop"
        elif request.params.stop and request.candidates is None:
            text = _decode(self.tokenizer, request.response_ids)
            # A few characters of slack: a multi-byte character split across tokens decodes
            # to a replacement character that the next token may turn into a shorter string.
            if find_stop(text, request.params.stop, max(0, request._text_len - 4)):
                finish_reason = "stop"
            request._text_len = len(text)
        if request.candidates is not None:
            complete_forced(request)
            if is_complete(request.candidates, request.response_ids):
                finish_reason = "stop"
        if finish_reason is None and len(request.response_ids) >= request.max_new_tokens:
            finish_reason = "length"
        if finish_reason is None:
            return False
        if text is None:
            text = _decode(self.tokenizer, request.response_ids)
        request.finish(finish_reason, text)
        return True


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """The response text: special tokens (EOS) skipped, as the invariant requires."""
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def shared_prefixes(
    requests: list[DecodeRequest], min_tokens: int
) -> list[tuple[list[DecodeRequest], int]]:
    """Groups of requests that share a prefix worth prefilling once, and its length.

    Requests that arrive together (the rollouts of one batch, clients with one system
    prompt) share prefixes that nothing stored holds yet, since none of them has been
    prefilled. In token order, each run of requests shares the shortest common prefix of
    its neighbours; a run is either one group, prefilling that prefix once, or split where
    its neighbours share least, whichever skips more prefilled tokens (so three prompts
    alike up to their last words are not tied to a fourth that shares only the system
    prompt with them). A group is kept when its prefix is at least ``min_tokens`` longer
    than what its members reuse already. The last token of each sequence is never shared:
    its logits are the request's own.
    """
    order = sorted(requests, key=sequence)
    ids = [np.asarray(sequence(r), dtype=np.int64) for r in order]
    # What neighbours i and i + 1 share, short of either one's last token.
    common = [
        common_prefix(a, b, min(len(a), len(b)) - 1) for a, b in zip(ids[:-1], ids[1:], strict=True)
    ]

    def best(lo: int, hi: int) -> tuple[int, list[tuple[int, int, int]]]:
        """The most prefill skipped over ``order[lo:hi]``, and its groups (lo, hi, n)."""
        if hi - lo < 2:
            return 0, []
        cut = min(range(lo, hi - 1), key=common.__getitem__)
        shared = common[cut]
        base = max(r.prefix_len for r in order[lo:hi])
        whole = (hi - lo - 1) * (shared - base) if shared - base >= min_tokens else 0
        left, right = best(lo, cut + 1), best(cut + 1, hi)
        if left[0] + right[0] > whole:
            return left[0] + right[0], left[1] + right[1]
        return whole, [(lo, hi, shared)] if whole else []

    return [(order[lo:hi], shared) for lo, hi, shared in best(0, len(order))[1]]
