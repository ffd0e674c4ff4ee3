"""Prefill on top of reused prefixes, in chunks: the forward passes that admit requests.

A request's sequence (its prompt, plus the tokens every choice of a constrained request
shares) is prefilled from ``start`` on: the tokens before ``start`` already have keys and
values, either reused from the prefix cache (:mod:`mage_rl.policy.prefix_cache`) or
computed by an earlier chunk of the same request. One forward pass prefills a group:

1. The cache: row ``i``'s ``start_i`` prefix states are right-aligned in ``W = max
   start`` columns (left-padded with masked zeros).
2. The input: each row's next tokens, left-padded to a common length ``T``; the attention
   mask is ``[prefix mask | input mask]`` of width ``W + T``, so a row whose input is
   shorter than ``T`` has masked columns between its prefix and its input. Position ids
   continue from ``start_i``, so each row sees exactly what it would see alone.
3. The result: the group's cache and mask (to join the running batch) and the logits
   of each row's last input token.

Chunked prefill (the engine's ``prefill_tokens`` budget) bounds the tokens of one such
pass, so a long prompt is prefilled over several passes with decode steps of the running
requests, and short newcomers' prefills, in between: nobody waits for a whole long
prefill before their next token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from mage_rl.policy.prefix_cache import LayerStates
from mage_rl.policy.requests import DecodeRequest


def sequence(request: DecodeRequest) -> list[int]:
    """The ids a request prefills: its prompt and any forced leading response tokens."""
    return request.prompt_ids + request.response_ids


def prefill_group(
    model: PreTrainedModel,
    requests: list[DecodeRequest],
    ends: list[int],
    pad_id: int,
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """One forward pass over ``sequence(r)[r.prefix_len : end]`` for every request.

    Args:
        model: The causal LM.
        requests: The group; ``prefix_len`` and ``prefix`` give each one's reused states.
        ends: Per request, where its input stops (the full sequence, or a chunk's end).
        pad_id: Id for padding (masked).

    Returns:
        ``(cache, mask, logits)``: the group's cache, its ``(B, W + T)`` attention mask
        and the ``(B, V)`` logits of each row's last input token.
    """
    device = next(model.parameters()).device
    starts = [r.prefix_len for r in requests]
    width = max(starts)
    cache = DynamicCache(config=model.config)
    prefix_mask = torch.zeros((len(requests), width), dtype=torch.long)
    if width:
        _fill_prefixes(cache, requests, width)
        for row, start in enumerate(starts):
            prefix_mask[row, width - start :] = 1
    inputs = [sequence(r)[s:e] for r, s, e in zip(requests, starts, ends, strict=True)]
    input_ids, input_mask = left_pad(inputs, pad_id)  # (B, T), (B, T)
    start = torch.tensor(starts, dtype=torch.long)[:, None]  # (B, 1)
    position_ids = start + (input_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    mask = torch.cat([prefix_mask, input_mask], dim=-1).to(device)  # (B, W + T)
    logits = model(
        input_ids=input_ids.to(device),
        attention_mask=mask,
        position_ids=position_ids.to(device),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1, :]  # (B, V)
    return cache, mask, logits


def row_states(cache: DynamicCache, mask: torch.Tensor, row: int) -> LayerStates:
    """Copy row ``row``'s states at its unmasked columns: ``(1, H, n, D)`` per layer."""
    columns = mask[row].nonzero().squeeze(-1)  # (n,): in token order
    states: LayerStates = []
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            states.append(None)  # a layer sharing another's cache
            continue
        keys = layer.keys[row : row + 1].index_select(2, columns)
        values = layer.values[row : row + 1].index_select(2, columns)
        states.append((keys, values))
    return states


def remaining(request: DecodeRequest) -> int:
    """Tokens of ``request`` still to prefill."""
    return len(sequence(request)) - request.prefix_len


def pad_time(states: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad cached states ``(B, H, L, D)`` with zeros to ``(B, H, width, D)``."""
    return F.pad(states, (0, 0, width - states.shape[-2], 0))


def pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad an attention mask ``(B, L)`` with zeros (masked) to ``(B, width)``."""
    return F.pad(mask, (width - mask.shape[-1], 0))


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists into ``(B, T)`` ids and a ``(B, T)`` mask (on the CPU)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def _fill_prefixes(cache: DynamicCache, requests: list[DecodeRequest], width: int) -> None:
    """Put each request's prefix states, right-aligned to ``width``, into ``cache``."""
    sample = next(r.prefix for r in requests if r.prefix is not None)
    for index, layer_states in enumerate(sample):
        if layer_states is None:
            continue
        sample_keys, sample_values = layer_states
        heads = sample_keys.shape[1]
        keys = sample_keys.new_zeros((len(requests), heads, width, sample_keys.shape[-1]))
        values = sample_values.new_zeros((len(requests), heads, width, sample_values.shape[-1]))
        for row, request in enumerate(requests):
            if request.prefix is None or request.prefix_len == 0:
                continue
            own = request.prefix[index]
            assert own is not None
            keys[row, :, width - request.prefix_len :] = own[0][0, :, : request.prefix_len]
            values[row, :, width - request.prefix_len :] = own[1][0, :, : request.prefix_len]
        cache.layers[index].update(keys, values)
