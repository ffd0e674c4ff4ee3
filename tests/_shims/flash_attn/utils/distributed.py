"""Plain-torch ``all_gather`` along the first axis, as flash-attn's."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather(input_: torch.Tensor, process_group) -> torch.Tensor:
    """Concatenate ``input_`` from every rank of ``process_group`` along dim 0."""
    world = dist.get_world_size(process_group)
    parts = [torch.empty_like(input_) for _ in range(world)]
    dist.all_gather(parts, input_.contiguous(), group=process_group)
    return torch.cat(parts, dim=0)
