"""Plain-torch versions of flash-attn's padding helpers (same signatures and results)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange

__all__ = ["index_first_axis", "pad_input", "rearrange", "unpad_input"]


def index_first_axis(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x[indices]`` along the first axis."""
    return x[indices]


def unpad_input(hidden: torch.Tensor, attention_mask: torch.Tensor, unused_mask=None):
    """``(B, S, ...)`` -> the valid tokens ``(N, ...)``, their flat indices, cu_seqlens,
    the longest length and the per-row lengths."""
    all_masks = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item())
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = rearrange(hidden, "b s ... -> (b s) ...")
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def pad_input(hidden: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of :func:`unpad_input`: scatter ``(N, ...)`` back into ``(B, S, ...)``."""
    out = torch.zeros(batch * seqlen, *hidden.shape[1:], device=hidden.device, dtype=hidden.dtype)
    out[indices] = hidden
    return rearrange(out, "(b s) ... -> b s ...", b=batch)
