"""Prefix caching: the key/value cache of earlier sequences, reused by later prompts.

Prompts that the engine sees share long prefixes: every call of a rollout starts with
the same system prompt and game rules, a server sees the same system prompt from many
clients, and in the conversation layout each call of a meta-episode is the previous
call's prompt and response followed by a few new tokens. Recomputing the keys and values
of a prefix the engine has already processed is wasted prefill. The rule:

1. When a request has been prefilled, and again when it finishes, the engine stores the
   ids whose keys and values are in its cache (the prompt; then the prompt and every
   response token that went through a forward pass) with those per-layer tensors.
2. A new request looks up the stored sequence sharing the longest prefix with its
   prompt; if that prefix is long enough, its keys and values are put in the new
   request's cache and only the rest of the prompt is prefilled, at positions that
   continue the prefix. The last prompt token is always prefilled: its logits give the
   first response token.
3. Memory is bounded by bytes: the least recently used sequences are evicted first. A
   stored sequence that is a prefix of a newly stored one is dropped (the new one covers
   it), and one already covered by a stored sequence is not stored again.

The keys and values of a token depend only on the tokens before it, so a reused prefix
gives the same attention inputs as a full prefill; only floating-point reduction order
(a prefill over fewer tokens, another batch shape) can differ in the last bits, as with
batching. Weights change the keys and values: the engine clears this cache when it loads
new weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

DEFAULT_MAX_ENTRIES = 1024
"""Most sequences a cache keeps by default (bounds lookup time, and memory where the
sequences are small)."""

LayerStates = list[tuple[torch.Tensor, torch.Tensor] | None]
"""Per layer ``(keys, values)`` of shape ``(1, H, n, D)``; ``None`` for a layer that
holds no cache of its own (it shares another layer's)."""


@dataclass
class PrefixCacheStats:
    """Counters of a :class:`PrefixCache`.

    Attributes:
        lookups: Prompts looked up.
        hits: Lookups that reused a prefix.
        reused_tokens: Prompt tokens whose prefill was skipped.
        stored: Sequences stored.
        evicted: Sequences evicted to stay within the memory bound.
    """

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    stored: int = 0
    evicted: int = 0


class _Entry:
    __slots__ = ("ids", "array", "layers", "nbytes")

    def __init__(self, ids: list[int], layers: LayerStates) -> None:
        self.ids = ids
        self.array = np.asarray(ids, dtype=np.int64)
        self.layers = layers
        self.nbytes = sum(kv[0].nbytes + kv[1].nbytes for kv in layers if kv is not None)


class PrefixCache:
    """Stored key/value states of token sequences, looked up by longest common prefix.

    Thread-safe: the engine's worker stores and looks up; other threads may clear it.

    Args:
        max_bytes: Memory bound of the stored tensors; least recently used sequences are
            evicted beyond it. A sequence larger than the bound is not stored.
        min_tokens: Shortest prefix worth reusing; shorter matches (a chat template's
            first few tokens) are ignored, since building a cache for them costs more
            than it saves.
        max_entries: Most sequences kept (bounds the time of a lookup, which compares
            the prompt with every stored sequence).
    """

    def __init__(
        self, max_bytes: int, *, min_tokens: int = 8, max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self.max_entries = max_entries
        self.stats = PrefixCacheStats()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recent first
        self._next_key = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored tensors."""
        return self._bytes

    def lookup(self, ids: Sequence[int]) -> tuple[int, LayerStates | None]:
        """The longest stored prefix of ``ids``, at most ``len(ids) - 1`` tokens.

        Args:
            ids: A prompt.

        Returns:
            ``(n, layers)``: the number of tokens reused and their per-layer states
            (views of the stored tensors, not copies), or ``(0, None)`` when no stored
            sequence shares at least ``min_tokens`` tokens with ``ids``.
        """
        query = np.asarray(ids, dtype=np.int64)
        limit = len(query) - 1  # the last prompt token is prefilled for its logits
        with self._lock:
            self.stats.lookups += 1
            best, best_key = 0, None
            for key, entry in self._entries.items():
                n = common_prefix(entry.array, query, limit)
                if n > best:
                    best, best_key = n, key
            if best < self.min_tokens or best_key is None:
                return 0, None
            entry = self._entries[best_key]
            self._entries.move_to_end(best_key)
            self.stats.hits += 1
            self.stats.reused_tokens += best
        layers: LayerStates = [
            None if kv is None else (kv[0][:, :, :best], kv[1][:, :, :best]) for kv in entry.layers
        ]
        return best, layers

    def store(self, ids: Sequence[int], layers: LayerStates) -> bool:
        """Keep the states of ``ids`` (``layers`` as :data:`LayerStates`, ``n = len(ids)``).

        Returns:
            Whether it was stored (not when a stored sequence already covers it, or when
            it alone exceeds the memory bound).
        """
        entry = _Entry([int(i) for i in ids], layers)
        if len(entry.ids) < self.min_tokens or entry.nbytes > self.max_bytes:
            return False
        n = len(entry.ids)
        with self._lock:
            for key, other in list(self._entries.items()):
                common = common_prefix(other.array, entry.array, n)
                if common == n:  # already covered
                    self._entries.move_to_end(key)
                    return False
                if common == len(other.ids):  # the new sequence extends this one
                    self._drop(key)
            key = self._next_key
            self._next_key += 1
            self._entries[key] = entry
            self._bytes += entry.nbytes
            self.stats.stored += 1
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))
                self.stats.evicted += 1
        return True

    def clear(self) -> None:
        """Drop every stored sequence (after a weight update they are stale)."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _drop(self, key: int) -> None:
        self._bytes -= self._entries.pop(key).nbytes


def common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n <= 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
