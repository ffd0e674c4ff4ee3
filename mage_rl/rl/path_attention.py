"""Attention along the paths of a prefix tree, as a Hugging Face attention function.

A packed prefix tree (:mod:`mage_rl.rl.prefix_tree`) is fed as one row of ``N`` nodes.
Under the tree's ``(N, N)`` mask, attention costs ``N^2`` whatever the tree shares. Along
the paths it costs what the sequences themselves cost: the queries, keys and values of
each sequence's nodes are gathered into a row of their own, attended causally (SDPA's
flash kernel skips the blocks above the diagonal), and each node takes its output from one
row through it. A node's row holds exactly its ancestors before it, so the output is the
mask's, and so is the gradient: the rows that repeat a shared node compute the same
output, and only the owner's is read.

:func:`use_path_attention` registers :func:`path_attention` with Hugging Face under
:data:`NAME` and switches a model to it. Without ``tree_paths`` in the call it is SDPA's
own attention, so padded batches and every other caller see no difference; masks are
built as for SDPA.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "mage_tree_paths"
"""The attention implementation's name in Hugging Face's registry."""


def path_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    tree_paths: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention; with ``tree_paths`` (``index``, ``owner`` of
    :meth:`~mage_rl.rl.prefix_tree.PrefixTree.path_index`), along the tree's paths.

    ``query`` is ``(1, H, N, D)`` and ``key``, ``value`` ``(1, H_kv, N, D)``; the result is
    ``(1, N, H, D)``, as Hugging Face's attention functions return it. The mask is not
    read on the paths: the paths are the mask.
    """
    if tree_paths is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    index, owner = tree_paths
    paths, longest = index.shape
    flat = index.reshape(-1)

    def along_paths(x: torch.Tensor) -> torch.Tensor:
        # (1, H, N, D) -> (H, S * L, D) -> (S, H, L, D): each path's nodes, in order
        heads, dim = x.shape[1], x.shape[3]
        return x[0].index_select(1, flat).view(heads, paths, longest, dim).transpose(0, 1)

    out, _ = sdpa_attention_forward(
        module, along_paths(query), along_paths(key), along_paths(value), None,
        dropout=dropout, scaling=scaling, is_causal=True,
    )  # fmt: skip
    # (S, L, H, D) -> (S * L, H, D) -> each node's output from its owner: (1, N, H, D)
    return out.flatten(0, 1).index_select(0, owner).unsqueeze(0), None


def use_path_attention(model: nn.Module) -> None:
    """Switch ``model`` (a Hugging Face model running SDPA) to :func:`path_attention`.

    The registration is global and idempotent; the switch is the model's own (a saved
    config does not record it).
    """
    AttentionInterface.register(NAME, path_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)  # type: ignore[operator]
