"""The sampling distribution: temperature, then top-k, then top-p, renormalised.

The engine samples from this distribution and records the log-probability of the drawn
token under it; the learner's teacher-forced scoring (:mod:`mage_rl.policy.scoring`)
calls the same function, so the two agree up to floating-point noise.

1. Divide the logits by the temperature ``T``.
2. Top-k: keep the ``k`` largest (``k == 0`` keeps all).
3. Top-p (nucleus): on the top-k distribution renormalised, keep the smallest set of most
   likely tokens whose mass reaches ``p``; the token that crosses ``p`` is kept, and so is
   the most likely token whatever ``p`` (a ``p`` that rounds to 0 in float32 would
   otherwise remove every token). This is the order of Hugging Face's logits warpers and
   of vLLM.
4. ``log_softmax`` over what is left; removed tokens get ``-inf``.

Greedy decoding (``T == 0``) is a point mass in principle, whose log-probability would be
0 for every token and carry no signal. By convention the engine records instead the
log-probability of the argmax under the *untempered, untruncated* distribution
(``log_softmax(logits)``), and this function returns that distribution for ``T == 0``.
Top-k and top-p are ignored when ``T == 0``.

References:
    Holtzman et al., "The Curious Case of Neural Text Degeneration" (top-p), 2020.
"""

from __future__ import annotations

import torch


def sampling_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor | float,
    top_k: torch.Tensor | int = 0,
    top_p: torch.Tensor | float = 1.0,
) -> torch.Tensor:
    """Log-probabilities of the distribution tokens are sampled from.

    Args:
        logits: Raw next-token logits, shape ``(N, V)``.
        temperature: ``(N,)`` or a scalar; 0 selects the greedy convention (see module
            docstring).
        top_k: ``(N,)`` or a scalar; 0 disables top-k.
        top_p: ``(N,)`` or a scalar in ``(0, 1]``; 1 disables top-p.

    Returns:
        Float32 log-probabilities, shape ``(N, V)``; truncated tokens are ``-inf``.
    """
    logits = logits.float()
    n, vocab = logits.shape
    temperature = _as_row_tensor(temperature, n, torch.float32, logits.device)
    top_k = _as_row_tensor(top_k, n, torch.long, logits.device)
    top_p = _as_row_tensor(top_p, n, torch.float32, logits.device)

    greedy = temperature == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    truncate = ((top_k > 0) & (top_k < vocab)) | (top_p < 1)
    truncate &= ~greedy
    if bool(truncate.any()):
        scaled = _truncate(scaled, top_k, top_p, truncate)
    return torch.log_softmax(scaled, dim=-1)


def _truncate(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Mask to ``-inf`` what top-k and top-p remove, on the rows flagged in ``rows``.

    Rows with a top-k order only their ``k`` largest logits; rows with a top-p alone sort
    the whole vocabulary. Both keep what a stable sort of every logit would keep: exact
    ties are broken by token id, so the engine and the scorer keep the same set even when
    logits tie at the boundary.
    """
    vocab = scaled.shape[-1]
    short = rows & (top_k > 0) & (top_k < vocab)
    full = rows & ~short
    out = scaled
    if bool(short.any()):
        index = short.nonzero().squeeze(-1)
        out = out.index_copy(0, index, _top_k_rows(scaled[index], top_k[index], top_p[index]))
    if bool(full.any()):
        index = full.nonzero().squeeze(-1)
        out = out.index_copy(0, index, _sorted_rows(scaled[index], top_p[index]))
    return out


def _top_k_rows(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k, then top-p, on rows whose ``k`` is under the vocabulary."""
    k = top_k[:, None]
    widest = int(top_k.max())
    kth = torch.topk(scaled, widest, dim=-1).values.gather(-1, k - 1)  # (R, 1)
    above = scaled > kth
    tied = scaled == kth
    # Of the logits equal to the k-th largest, the lowest ids fill the k places left.
    keep = above | (tied & (tied.cumsum(-1) <= k - above.sum(-1, keepdim=True)))
    # The kept tokens in stable order: ids ascending, then logits descending, stably.
    values, ids = torch.topk(scaled.masked_fill(~keep, float("-inf")), widest, dim=-1)
    by_id = ids.argsort(-1)
    ids, values = ids.gather(-1, by_id), values.gather(-1, by_id)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    ids, values = ids.gather(-1, order), values.gather(-1, order)
    probs = torch.softmax(values, dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    drop[:, 0] = False
    keep = keep.scatter(-1, ids, keep.gather(-1, ids) & ~drop)
    return scaled.masked_fill(~keep, float("-inf"))


def _sorted_rows(scaled: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p on rows without a top-k: the whole vocabulary sorted."""
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # (R, V)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # exclusive cumsum: keeps the crossing token
    remove = mass_before >= top_p[:, None]
    remove[:, 0] = False  # the most likely token always stays: no row is left empty
    mask = torch.zeros_like(remove).scatter(-1, order, remove)  # back to vocabulary order
    return scaled.masked_fill(mask, float("-inf"))


def _as_row_tensor(
    value: torch.Tensor | float | int, n: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.to(device=device, dtype=dtype)
        return value.expand(n) if value.dim() == 0 else value
    return torch.full((n,), value, dtype=dtype, device=device)


def draw(
    logprobs: torch.Tensor,
    greedy: list[bool],
    generators: list[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return it with its recorded log-probability.

    Args:
        logprobs: Output of :func:`sampling_logprobs`, shape ``(N, V)``.
        greedy: Per row, whether to take the argmax instead of sampling.
        generators: One generator per row, so that a request's draws depend only on its
            own seed, not on which other requests share the batch.

    Returns:
        ``(tokens, token_logprobs)``, each of shape ``(N,)``.

    Raises:
        ValueError: If a row is not a distribution (see :func:`draw_rows`).
    """
    drawn = draw_rows(logprobs, greedy, generators)
    for outcome in drawn:
        if isinstance(outcome, ValueError):
            raise outcome
    pairs = [outcome for outcome in drawn if not isinstance(outcome, ValueError)]
    tokens = torch.tensor([t for t, _ in pairs], dtype=torch.long, device=logprobs.device)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def draw_rows(
    logprobs: torch.Tensor, greedy: list[bool], generators: list[torch.Generator]
) -> list[tuple[int, float] | ValueError]:
    """Draw one token per row of :func:`sampling_logprobs`, with its log-probability.

    A sampled row takes one uniform number from its own generator and inverts the row's
    cumulative distribution there (a greedy row takes the argmax and leaves its generator
    untouched), so its draw depends only on its own stream. The rows' distributions are
    summed and searched together: one pass over ``(N, V)`` for the whole batch, where a
    ``torch.multinomial`` per row scanned the vocabulary once per row (about 30 ms a row
    for SmolLM2's 49,152 tokens on a 2-core CPU).

    Args:
        logprobs: ``(N, V)`` log-probabilities.
        greedy: Per row, take the argmax instead of sampling.
        generators: Per row, its random stream.

    Returns:
        Per row, ``(token, logprob)``, or a ``ValueError`` when the row is not a
        distribution (NaN, or every token removed), which an extreme temperature can
        cause; the caller fails only that row's request.
    """
    if not len(greedy) == len(generators) == logprobs.shape[0]:
        raise ValueError("give one greedy flag and one generator per row")
    if logprobs.shape[0] == 0:
        return []
    # A row's maximum is NaN when a NaN is there (amax propagates it) and -inf when every
    # token is removed. Greedy rows and invalid ones (discarded) take the argmax.
    valid = torch.isfinite(logprobs.amax(-1)).tolist()
    tokens = logprobs.argmax(-1)
    sampled = [i for i, (ok, g) in enumerate(zip(valid, greedy, strict=True)) if ok and not g]
    if sampled:
        rows = torch.tensor(sampled, device=logprobs.device)
        # Summed in float64: a token's interval keeps its width along 10^5 tokens.
        probs = logprobs[rows].double().exp()
        cdf = probs.cumsum(-1)  # (S, V)
        u = torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64,
                                  device=logprobs.device) for i in sampled])  # fmt: skip
        # The first token whose cumulative mass passes u * total; a token of mass 0 never
        # is (its cumulative equals its predecessor's). Should rounding put u * total at
        # the very top, the row takes the last token that has mass.
        picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        picked = picked.clamp(max=probs.shape[-1] - 1)
        empty = (probs.gather(-1, picked) == 0).squeeze(-1)
        if bool(empty.any()):
            massive = probs[empty] > 0
            picked[empty, 0] = massive.shape[-1] - 1 - massive.flip(-1).int().argmax(-1)
        tokens[rows] = picked.squeeze(-1)
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    return [
        (token, logprob)
        if ok
        else ValueError(
            "the sampling distribution is not finite (NaN or empty); the temperature is "
            "too small for the logits' range: use 0 for greedy decoding or a larger value"
        )
        for ok, token, logprob in zip(valid, tokens.tolist(), chosen.tolist(), strict=True)
    ]
