"""Teacher-forced log-probabilities: score a given response with one forward pass.

The learner needs ``log pi(response | prompt)`` under the current weights, token by token,
computed exactly the way the engine recorded it at sampling time (same temperature, same
truncation, see :mod:`mage_rl.policy.sampling`), so that the importance ratio of PPO is 1
when the weights have not changed.

1. Concatenate prompt and response ids and run the model once (no KV cache).
2. The logits at position ``t`` predict token ``t + 1``: keep the ``R`` positions that
   predict the response, ``P - 1 .. P + R - 2``.
3. Apply :func:`~mage_rl.policy.sampling.sampling_logprobs` and gather the response ids.

The functions run under whatever autograd mode the caller set: the learner calls them with
gradients on, tests and evaluation under ``torch.no_grad()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mage_rl.policy.sampling import sampling_logprobs


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Log-probabilities of ``targets`` under the sampling distribution of ``logits``.

    Args:
        logits: Logits predicting each target, shape ``(..., V)``.
        targets: Token ids, shape ``logits.shape[:-1]``.
        temperature: Sampling temperature (0 is the greedy convention: untempered).
        top_k: Top-k truncation the tokens were sampled with (0 for none).
        top_p: Top-p truncation the tokens were sampled with (1 for none).

    Returns:
        Float32 log-probabilities, shape ``targets.shape``. A target that truncation
        removes gets ``-inf``.
    """
    flat = logits.reshape(-1, logits.shape[-1])  # (N, V)
    logp = sampling_logprobs(flat, temperature, top_k, top_p)
    picked = logp.gather(-1, targets.reshape(-1, 1).to(logp.device)).squeeze(-1)  # (N,)
    return picked.reshape(targets.shape)


def teacher_forced_logprobs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int] | torch.Tensor,
    response_ids: Sequence[int] | torch.Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Recompute the per-token log-probs of one response with a single forward pass.

    Args:
        model: A causal LM returning ``.logits`` of shape ``(1, T, V)``.
        prompt_ids: Rendered prompt ids (at least one token).
        response_ids: Response ids, EOS included when it was generated.
        temperature: Temperature the response was sampled with.
        top_k: Top-k it was sampled with.
        top_p: Top-p it was sampled with.

    Returns:
        Float32 tensor of shape ``(len(response_ids),)``, on the model's device.

    Raises:
        ValueError: If the prompt is empty.
    """
    device = next(model.parameters()).device
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(-1)
    response = torch.as_tensor(response_ids, dtype=torch.long, device=device).reshape(-1)
    if prompt.numel() == 0:
        raise ValueError("teacher_forced_logprobs needs a non-empty prompt to predict from")
    if response.numel() == 0:
        return torch.zeros(0, device=device)
    ids = torch.cat([prompt, response])[None, :]  # (1, P + R)
    p, r = prompt.numel(), response.numel()
    logits = model(input_ids=ids, use_cache=False).logits[0, p - 1 : p + r - 1]  # (R, V)
    return token_logprobs(logits, response, temperature, top_k, top_p)
