"""Partial fine-tuning: freeze every weight of a causal LM but its top decoder blocks
(``LearnerConfig.train_top_layers``), so the learner's backward pass stops early."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

logger = logging.getLogger(__name__)


def train_only_top_layers(model: Any, count: int) -> None:
    """Freeze every weight but the last ``count`` decoder blocks, the final norm and an
    untied output head (``LearnerConfig.train_top_layers``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    blocks = getattr(decoder, "layers", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(
            f"learner.train_top_layers needs a model whose decoder keeps its blocks in "
            f"`.layers` (Llama, Qwen, Mistral...); {type(model).__name__} does not: set "
            "train_top_layers: 0 to train every weight"
        )
    if count > len(blocks):
        raise ValueError(
            f"learner.train_top_layers is {count} but the model has {len(blocks)} decoder "
            "blocks; give at most that many (0 trains every weight)"
        )
    model.requires_grad_(False)
    for block in blocks[len(blocks) - count :]:
        block.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if isinstance(norm, nn.Module):
        norm.requires_grad_(True)
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and (embeddings is None or head.weight is not embeddings.weight):
        head.requires_grad_(True)
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    logger.info(
        "training the top %d of %d decoder blocks: %.1fM of %.1fM weights",
        count,
        len(blocks),
        trained / 1e6,
        total / 1e6,
    )
