"""Decode steps over preallocated key/value buffers, replayed as CUDA graphs on a GPU.

A decode step of a small model on a GPU is bound by the host: the model's Python
launches about 1,400 kernels a step, each costing tens of microseconds of host time
against a few microseconds of GPU work (docs/cluster.md, "Figures on an H100"). A CUDA
graph records the step's kernels once and replays them with one launch; it needs every
tensor the step touches at a fixed address and of a fixed shape. :class:`StaticDecoder`
gives the running batch (:class:`~mage_rl.policy.decoding.RunningBatch`) exactly that:

1. **Buffers.** Keys and values of every layer live in ``(R, K, C, D)`` buffers: ``R``
   rows (a power of two, at least the batch), ``C`` columns (the batch's width plus
   room to grow, in blocks of :data:`BLOCK`). The batch's cache is right-aligned in the
   running batch already (left padding, masked), so every row writes its next token's
   keys and values at the same column: one shared write index.
2. **Views.** After each step the running batch's ``DynamicCache`` layers are set to
   views ``buffer[:B, :, :W + 1]`` of the buffers, so everything that reads the cache
   (the prefix cache storing a finished row, merging newcomers) sees the same tensors as
   before. Anything that changes the cache (rows leaving, newcomers merged, a new batch)
   replaces those views; the next step notices (the layers no longer hold the views it
   set) and copies the cache into the buffers again, growing them when they are too
   small. While the batch is unchanged a step copies nothing but its inputs.
3. **One step.** Inputs (each row's token, its position and the write index) are copied
   into fixed tensors; the forward pass runs with an additive ``(R, 1, 1, C)`` attention
   mask (0 where a row attends, the dtype's minimum elsewhere; a padding row attends to
   column 0 alone, so its output stays finite) and a cache whose layers write the new
   column in place (``index_copy_``). On CUDA the pass is captured once per buffer shape
   and replayed; elsewhere (``graphs=False``) it runs eagerly over the same buffers.

The mask's extra columns change no value: masked columns add exactly zero weight, so a
step computes what the growing cache computes, up to the order of floating-point sums.
Weights are updated in place (:func:`~mage_rl.policy.weights.load_weights`), so a graph
stays valid across weight updates. A capture that fails is logged and the decoder runs
eagerly from then on (``stats.graph_failures`` counts it); the eager steps use the same
buffers, so the answers are the same.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from mage_rl.policy.requests import DecodeStats

logger = logging.getLogger(__name__)

BLOCK = 128
"""Columns are allocated in blocks of this many, with at least this many free."""


MODES = ("auto", "off", "eager", "graphs")


def resolve_static_decode(mode: str, device: torch.device) -> str:
    """``mode`` checked, with ``"auto"`` resolved: ``"graphs"`` on CUDA, else ``"off"``."""
    if mode not in MODES:
        raise ValueError(f"static_decode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "auto":
        return "graphs" if device.type == "cuda" else "off"
    return mode


class _BufferLayer(CacheLayerMixin):
    """One layer's preallocated keys and values; each update writes one column in place."""

    is_compileable = True
    is_sliding = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("buffer layers are allocated before use")

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2], 0

    def get_seq_length(self) -> int:
        return self.keys.shape[-2]

    def get_max_length(self) -> int:
        return self.keys.shape[-2]


class StaticDecoder:
    """Decode steps of a running batch over fixed buffers (module docstring).

    Args:
        model: The engine's causal LM; every layer must attend over the full context
            (the running batch checks this: ``RunningBatch.mergeable``).
        stats: The engine's counters; ``graph_captures``, ``graph_steps``,
            ``graph_failures`` and ``static_copies`` are updated in place.
        graphs: Capture and replay CUDA graphs (the model must be on a CUDA device);
            ``False`` runs every step eagerly over the same buffers.
    """

    def __init__(self, model: PreTrainedModel, stats: DecodeStats, *, graphs: bool) -> None:
        self.model = model
        self.stats = stats
        self.device = next(model.parameters()).device
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the model on a CUDA device, not {self.device}")
        self.graphs = graphs
        self.rows = 0
        self.columns = 0
        self._width = 0  # columns the running batch's cache holds (its mask's width)
        self._views: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: torch.Tensor | None = None

    def forward(
        self,
        cache: DynamicCache,
        mask: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """One decode step: each row's token in, its next-token logits out.

        Args:
            cache: The running batch's cache, ``(B, K, W, D)`` per layer; its layers are
                left holding views of the buffers, ``W + 1`` columns wide.
            mask: ``(B, W)``, 1 where a row attends (before this step's column).
            tokens: ``(B,)`` each row's last token.
            positions: ``(B,)`` each row's position for it.

        Returns:
            ``(B, V)`` logits, a view of a buffer that the next step overwrites.
        """
        rows, width = mask.shape
        if not self._holds(cache, rows, width):
            self._copy_in(cache, mask)
        self._tokens[:rows, 0].copy_(tokens)
        self._positions[:rows, 0].copy_(positions)
        self._column.fill_(width)
        if self.graphs and self._graph is None:
            self._capture()
        if self._graph is not None:
            self._graph.replay()
            self.stats.graph_steps += 1
            assert self._out is not None
            logits = self._out[:rows]
        else:
            logits = self._forward(rows)
        self._views = []
        for layer, buffer in zip(cache.layers, self._layers, strict=True):
            layer.keys = buffer.keys[:rows, :, : width + 1]
            layer.values = buffer.values[:rows, :, : width + 1]
            self._views.append((layer.keys, layer.values))
        self._width = width + 1
        return logits

    # -- internals -------------------------------------------------------------------

    def _holds(self, cache: DynamicCache, rows: int, width: int) -> bool:
        """Whether ``cache`` is still the views the last step left, with room for one more."""
        return (
            width == self._width
            and width < self.columns
            and len(self._views) == len(cache.layers)
            and all(
                layer.keys is keys and layer.values is values
                for layer, (keys, values) in zip(cache.layers, self._views, strict=True)
            )
            and self._views[0][0].shape[0] == rows
        )

    def _copy_in(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Copy the running batch's cache and mask into the buffers (grown if needed)."""
        rows, width = mask.shape
        if rows > self.rows or width + 1 > self.columns:
            self._allocate(cache, max(rows, self.rows), width)
        for layer, buffer in zip(cache.layers, self._layers, strict=True):
            buffer.keys[:rows, :, :width].copy_(layer.keys)
            buffer.values[:rows, :, :width].copy_(layer.values)
        floor = torch.finfo(self._mask.dtype).min
        self._mask.fill_(floor)
        self._mask[:rows, 0, 0, :width].masked_fill_(mask.bool(), 0.0)
        self._mask[rows:, 0, 0, 0] = 0.0  # padding rows attend to one column: finite output
        self.stats.static_copies += 1

    def _allocate(self, cache: DynamicCache, rows: int, width: int) -> None:
        """Buffers of ``2^k >= rows`` rows and room for ``BLOCK`` more columns than ``width``."""
        self._graph, self._out, self._views = None, None, []
        self.rows = 1 << max(rows - 1, 0).bit_length()
        self.columns = -(-(width + 1 + BLOCK) // BLOCK) * BLOCK
        self._layers = []
        self._column = torch.zeros(1, dtype=torch.long, device=self.device)
        for layer in cache.layers:
            _, heads, _, dim = layer.keys.shape
            shape = (self.rows, heads, self.columns, dim)
            keys = layer.keys.new_zeros(shape)
            values = layer.values.new_zeros((*shape[:3], layer.values.shape[-1]))
            self._layers.append(_BufferLayer(keys, values, self._column))
        dtype = self._layers[0].keys.dtype
        self._mask = torch.zeros((self.rows, 1, 1, self.columns), dtype=dtype, device=self.device)
        self._tokens = torch.zeros((self.rows, 1), dtype=torch.long, device=self.device)
        self._positions = torch.zeros((self.rows, 1), dtype=torch.long, device=self.device)

    def _forward(self, rows: int) -> torch.Tensor:
        """The step itself over the first ``rows`` rows: writes a column, returns logits."""
        self._mask[:rows].index_fill_(3, self._column, 0.0)
        layers = self._layers
        if rows < self.rows:
            layers = [
                _BufferLayer(b.keys[:rows], b.values[:rows], self._column) for b in self._layers
            ]
        out = self.model(
            input_ids=self._tokens[:rows],
            attention_mask=self._mask[:rows],
            position_ids=self._positions[:rows],
            past_key_values=Cache(layers=list(layers)),
            use_cache=True,
        )
        return out.logits[:, -1, :]

    def _capture(self) -> None:
        """Record one step over all rows as a CUDA graph; on failure, run eagerly."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            # Warm-up passes on a side stream (as capture requires) write the very column
            # the step writes, from the same inputs: nothing changes but the allocator.
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(self.rows)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                self._out = self._forward(self.rows)
            self._graph = graph
            self.stats.graph_captures += 1
        except Exception:
            logger.warning(
                "capturing a CUDA graph of the decode step failed; decoding eagerly over "
                "the same buffers from now on", exc_info=True,
            )  # fmt: skip
            self.stats.graph_failures += 1
            self.graphs, self._graph, self._out = False, None, None
            torch.cuda.synchronize(self.device)
