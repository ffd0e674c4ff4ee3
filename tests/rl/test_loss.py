"""PPO-clip surrogate, k3 KL and entropy on hand-written tensors (SPEC §6)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from mage_rl.rl.loss import (
    entropy_from_logits,
    gather_logprobs,
    kl_penalty,
    policy_loss,
    token_mean,
)

LN = math.log


def test_ratio_one_gives_minus_mean_advantage() -> None:
    # Tokens: row 0 has 3 valid tokens with A = 1, row 1 has 1 valid token with A = -2.
    # Token mean: -(1 + 1 + 1 - 2) / 4 = -0.25.
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])  # per sample, spread over its tokens
    loss, stats = policy_loss(logp, logp.clone(), adv, mask)
    assert loss.item() == pytest.approx(-0.25)
    assert stats["clip_frac"].item() == 0.0
    assert stats["approx_kl"].item() == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("ratio", "adv", "expected_loss", "clipped", "has_grad"),
    [
        # A > 0, ratio 1.5: min(1.5 * 2, 1.2 * 2) = 2.4 -> loss -2.4, clipped, no gradient.
        (1.5, 2.0, -2.4, True, False),
        # A > 0, ratio 0.5: min(0.5 * 2, 0.8 * 2) = 1.0 -> loss -1.0, unclipped.
        (0.5, 2.0, -1.0, False, True),
        # A < 0, ratio 1.5: min(1.5 * -2, 1.2 * -2) = -3.0 -> loss 3.0, unclipped.
        (1.5, -2.0, 3.0, False, True),
        # A < 0, ratio 0.5: min(0.5 * -2, 0.8 * -2) = -1.6 -> loss 1.6, clipped, no gradient.
        (0.5, -2.0, 1.6, True, False),
    ],
)
def test_clipping_cases(
    ratio: float, adv: float, expected_loss: float, clipped: bool, has_grad: bool
) -> None:
    old = torch.tensor([[-1.0]])
    logp = (old + LN(ratio)).requires_grad_(True)
    loss, stats = policy_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    assert stats["clip_frac"].item() == float(clipped)
    assert (logp.grad.abs().item() > 0) == has_grad
    if has_grad:  # d(-ratio * A)/d logp = -ratio * A
        assert logp.grad.item() == pytest.approx(-ratio * adv, rel=1e-6)


def test_mask_is_respected() -> None:
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    old = torch.tensor([[-1.2, -1.0], [-0.9, -1.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, old, adv, mask)
    # Garbage in padded positions changes nothing.
    logp2, old2, adv2 = logp.clone(), old.clone(), adv.clone()
    logp2[:, 1], old2[:, 1], adv2[:, 1] = 50.0, -50.0, 1e6
    loss2, stats2 = policy_loss(logp2, old2, adv2, mask)
    assert loss2.item() == pytest.approx(loss.item())
    assert stats2["approx_kl"].item() == pytest.approx(stats["approx_kl"].item())
    # Hand value: ratios e^0.2 (A = 1, clipped to 1.2) and e^-0.1 (A = -1, unclipped):
    # loss = (-1.2 + e^-0.1) / 2; approx_kl = mean(old - new) = (-0.2 + 0.1) / 2 = -0.05.
    assert loss.item() == pytest.approx((-1.2 + math.exp(-0.1)) / 2, rel=1e-6)
    assert stats["approx_kl"].item() == pytest.approx(-0.05, rel=1e-5)
    assert stats["clip_frac"].item() == pytest.approx(0.5)


def test_token_mean_is_exact_across_micro_batches() -> None:
    torch.manual_seed(0)
    logp = torch.randn(5, 7)
    old = logp + 0.3 * torch.randn(5, 7)
    adv = torch.randn(5)
    mask = (torch.rand(5, 7) > 0.3).float()
    full, full_stats = policy_loss(logp, old, adv, mask)
    total = mask.sum()
    parts = [
        policy_loss(logp[s], old[s], adv[s], mask[s], num_tokens=total)
        for s in (slice(0, 2), slice(2, 5))
    ]
    assert sum(p[0] for p in parts).item() == pytest.approx(full.item(), rel=1e-6)
    for name in ("clip_frac", "approx_kl"):
        assert sum(p[1][name] for p in parts).item() == pytest.approx(
            full_stats[name].item(), rel=1e-5
        )
    # A sample-order permutation leaves the token mean unchanged.
    perm = torch.randperm(5)
    permuted, _ = policy_loss(logp[perm], old[perm], adv[perm], mask[perm])
    assert permuted.item() == pytest.approx(full.item(), rel=1e-6)


def test_k3_kl() -> None:
    same = torch.tensor([[-0.5, -2.0]])
    assert torch.equal(kl_penalty(same, same.clone()), torch.zeros(1, 2))
    # logp - ref = ln 2: k3 = e^{-ln 2} - 1 + ln 2 = 0.5 - 1 + 0.6931 = 0.1931;
    # logp - ref = -ln 2: k3 = 2 - 1 - 0.6931 = 0.3069.
    logp = torch.tensor([[LN(0.5), LN(0.25)]])
    ref = torch.tensor([[LN(0.25), LN(0.5)]])
    kl = kl_penalty(logp, ref, "low_var_kl")
    torch.testing.assert_close(kl, torch.tensor([[0.5 - 1 + LN(2), 2 - 1 - LN(2)]]))
    assert torch.equal(kl_penalty(logp, ref, "k3"), kl)
    # Positive for any mismatch; clamped to 10 for a huge ratio (e^20 - 1 - 20).
    rng = torch.Generator().manual_seed(0)
    a, b = torch.randn(100, generator=rng), torch.randn(100, generator=rng)
    assert (kl_penalty(a, b) > 0).all()
    assert kl_penalty(torch.tensor([-20.0]), torch.tensor([0.0])).item() == 10.0
    # k1 and k2 on the same tokens.
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), torch.tensor([[LN(2), -LN(2)]]))
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), torch.tensor([[LN(2) ** 2 / 2] * 2]))
    with pytest.raises(ValueError, match="unknown KL"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_entropy_and_logprobs_from_logits() -> None:
    # Uniform over 4 tokens: H = ln 4; a near-deterministic row: H ~ 0.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[LN(4), 0.0]]))
    # Token mean over the valid tokens only.
    mask = torch.tensor([[1.0, 0.0]])
    assert token_mean(entropy_from_logits(logits), mask).item() == pytest.approx(LN(4))
    # log p of token 0: ln(1/4) in the uniform row, ~0 in the peaked row.
    logp = gather_logprobs(logits, torch.tensor([[0, 0]]))
    torch.testing.assert_close(logp, torch.tensor([[-LN(4), 0.0]]))


def test_matches_openrlhf() -> None:
    """Same tensors through OpenRLHF's PolicyLoss and compute_approx_kl (when installed)."""
    pytest.importorskip("openrlhf")
    from openrlhf.models.loss import PolicyLoss
    from openrlhf.models.utils import compute_approx_kl

    torch.manual_seed(0)
    logp = torch.randn(4, 6) * 0.5 - 1.0
    old = logp + 0.4 * torch.randn(4, 6)
    ref = logp + 0.4 * torch.randn(4, 6)
    adv = torch.randn(4, 1).expand(4, 6).contiguous()
    mask = (torch.rand(4, 6) > 0.25).float()
    mask[:, 0] = 1.0

    params = inspect.signature(PolicyLoss.__init__).parameters
    theirs_fn = (
        PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)
        if "clip_eps_low" in params
        else PolicyLoss(0.2)
    )
    theirs = theirs_fn(logp, old, adv, action_mask=mask)
    their_loss = theirs[0] if isinstance(theirs, tuple) else theirs
    ours, stats = policy_loss(logp, old, adv, mask, clip_eps=0.2)
    torch.testing.assert_close(ours, their_loss, rtol=1e-5, atol=1e-6)
    if isinstance(theirs, tuple) and len(theirs) > 1:
        torch.testing.assert_close(stats["clip_frac"], theirs[1].float(), rtol=1e-5, atol=1e-6)

    kl_params = inspect.signature(compute_approx_kl).parameters
    if "kl_estimator" in kl_params:
        their_kl = compute_approx_kl(logp, ref, kl_estimator="k3")
    else:  # older releases
        their_kl = compute_approx_kl(logp, ref, action_mask=mask, use_kl_estimator_k3=True)
    torch.testing.assert_close(kl_penalty(logp, ref, "low_var_kl") * mask, their_kl * mask)
