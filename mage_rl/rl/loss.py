"""Token-level losses of the policy update: PPO-clip surrogate, k3 KL, entropy.

References:
    PPO (Schulman et al. 2017, arXiv 1707.06347), eq. 7 (clipped surrogate).
    Approximating KL divergence (Schulman 2020, http://joschu.net/blog/kl-approx.html):
    k1, k2, k3 estimators; k3 is the ``low_var_kl`` of verl and the ``k3`` of OpenRLHF.
    SPEC.md section 6.

All functions are pure tensor functions over right-padded ``(B, T)`` token grids with a
``mask`` of the valid response tokens.

Token-mean aggregation. The loss is the mean over every valid token of a *mini-batch*
(one optimizer step), so long responses weigh in proportion to their tokens. When a
mini-batch is processed as several micro-batches with gradient accumulation, each
micro-batch passes ``num_tokens`` = the valid-token count of the whole mini-batch: its
loss is then ``sum over its tokens / num_tokens``, and the micro-batch losses (and their
gradients) add up exactly to the mini-batch token mean. Every statistic returned here is
normalized the same way, so statistics also add up across micro-batches.
"""

from __future__ import annotations

import torch

from mage_rl.sections import KLKind

KL_CLAMP = 10.0  # OpenRLHF compute_approx_kl clamps every estimator to [-10, 10]


def token_mean(
    values: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Sum of ``values`` over valid tokens divided by ``num_tokens``.

    Args:
        values: Per-token values, shape ``(B, T)``.
        mask: 1 for valid tokens, 0 for padding, shape ``(B, T)``.
        num_tokens: Denominator; defaults to ``mask.sum()`` (the plain token mean). Pass
            the mini-batch token count when ``values`` is one micro-batch of it.

    Returns:
        Scalar tensor.
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum()
    denom = mask.sum() if num_tokens is None else num_tokens
    denom = denom.clamp(min=1.0) if isinstance(denom, torch.Tensor) else max(float(denom), 1.0)
    return total / denom


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip surrogate with token-mean aggregation (PPO eq. 7; SPEC §6).

    Per token, with ``ratio = exp(logprobs - old_logprobs)``:
    ``loss = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``, averaged over the valid
    tokens (see the module docstring for ``num_tokens``).

    Args:
        logprobs: Log-probs of the sampled tokens under the current policy, ``(B, T)``.
        old_logprobs: Log-probs under the policy that sampled them, ``(B, T)``.
        advantages: Per-token advantages ``(B, T)``, or per-sample ``(B,)`` spread over
            the sample's tokens.
        mask: 1 for valid response tokens, ``(B, T)``.
        clip_eps: PPO clip range epsilon.
        num_tokens: Token-mean denominator (defaults to ``mask.sum()``).

    Returns:
        ``(loss, stats)``: the scalar loss and detached statistics, each normalized by the
        same denominator: ``clip_frac`` (fraction of tokens where the clipped term is the
        active one) and ``approx_kl`` (k1 estimate of KL(old || new),
        ``mean(old_logprobs - logprobs)``).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B,) -> (B, 1), broadcast over tokens
    advantages = advantages.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs.to(logprobs.dtype)  # (B, T)
    ratio = log_ratio.exp()
    surr_unclipped = ratio * advantages
    surr_clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.min(surr_unclipped, surr_clipped)
    clipped = (surr_clipped < surr_unclipped).detach()
    loss = token_mean(per_token, mask, num_tokens)
    with torch.no_grad():
        stats = {
            "clip_frac": token_mean(clipped.to(logprobs.dtype), mask, num_tokens),
            "approx_kl": token_mean(-log_ratio.detach(), mask, num_tokens),
        }
    return loss, stats


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "low_var_kl"
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    Mirrors OpenRLHF ``compute_approx_kl``: with ``log_ratio = logprobs - ref_logprobs``,
    ``k1 = log_ratio``; ``k2 = log_ratio**2 / 2``; ``k3`` (``low_var_kl``, Schulman's
    unbiased, non-negative, low-variance estimator) ``= exp(-log_ratio) - 1 + log_ratio``.
    Every estimator is clamped to ``[-10, 10]`` to keep rare tokens with a huge ratio from
    dominating the loss. Computed in float32.

    Args:
        logprobs: Current policy log-probs of the sampled tokens, ``(B, T)``.
        ref_logprobs: Reference policy log-probs of the same tokens, ``(B, T)``.
        kind: ``"low_var_kl"``/``"k3"``, ``"k1"``/``"kl"``, or ``"k2"``/``"mse"``.

    Returns:
        Per-token KL estimate, ``(B, T)``; aggregate with :func:`token_mean`.
    """
    log_ratio = logprobs.float() - ref_logprobs.float()
    if kind in ("k3", "low_var_kl"):
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
    elif kind in ("k1", "kl"):
        kl = log_ratio
    elif kind in ("k2", "mse"):
        kl = 0.5 * log_ratio.square()
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; use 'low_var_kl' (k3), 'k1' or 'k2'")
    return kl.clamp(min=-KL_CLAMP, max=KL_CLAMP)


def entropy_from_logits(
    logits: torch.Tensor, allowed_index: torch.Tensor | None = None
) -> torch.Tensor:
    """Entropy of the sampling distribution at each position.

    ``H = logsumexp(z) - sum(softmax(z) * z)``, computed in float32. Positions restricted
    by constrained decoding use the restricted distribution (see :func:`gather_logprobs`).

    Args:
        logits: ``(B, T, V)``, already divided by the sampling temperature.
        allowed_index: Optional ``(B, T, A)`` allowed token ids padded with -1.

    Returns:
        Per-token entropy, ``(B, T)``; aggregate with :func:`token_mean`.
    """
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    entropy = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
    if allowed_index is None:
        return entropy
    sub, restricted = _restricted_logits(logits, allowed_index)
    sub_probs = torch.softmax(sub, dim=-1)
    sub_entropy = torch.logsumexp(sub, dim=-1) - (sub_probs * sub.clamp(min=-1e30)).sum(dim=-1)
    return torch.where(restricted, sub_entropy, entropy)


def gather_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, allowed_index: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probability of ``token_ids`` under the sampling distribution, in float32.

    Without ``allowed_index`` that is the softmax of ``logits``. With it, a position whose
    allowed set is non-empty uses the softmax restricted to that set,
    ``z_t - logsumexp(z_a for a in allowed)``, exactly as constrained decoding sampled it
    (:mod:`mage_rl.policy.constrained`); positions whose row is all -1 stay unrestricted.

    Args:
        logits: ``(B, T, V)``, already divided by the sampling temperature.
        token_ids: ``(B, T)`` int64.
        allowed_index: Optional ``(B, T, A)`` int64 allowed ids padded with -1.

    Returns:
        ``(B, T)``.
    """
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    if allowed_index is None:
        return logp
    sub, restricted = _restricted_logits(logits, allowed_index)
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return torch.where(restricted, picked - torch.logsumexp(sub, dim=-1), logp)


def _restricted_logits(
    logits: torch.Tensor, allowed_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the allowed ids, ``(B, T, A)`` with -inf on padding, and which rows are restricted.

    Unrestricted rows keep their first slot finite, so that no ``logsumexp`` over an empty
    set produces a NaN gradient through the branch :func:`torch.where` discards.
    """
    index = allowed_index.to(logits.device)
    valid = index >= 0  # (B, T, A)
    restricted = valid.any(dim=-1)  # (B, T)
    keep = valid.clone()
    keep[..., 0] |= ~restricted
    sub = logits.gather(-1, index.clamp(min=0)).masked_fill(~keep, float("-inf"))
    return sub, restricted
