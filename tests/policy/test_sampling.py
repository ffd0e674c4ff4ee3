"""The sampling distribution on hand-written logits."""

from __future__ import annotations

import math

import pytest
import torch

from mage_rl.policy.sampling import draw, sampling_logprobs
from mage_rl.policy.scoring import token_logprobs


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def test_temperature_divides_logits() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    got = sampling_logprobs(logits, 2.0)
    torch.testing.assert_close(got, torch.log_softmax(torch.tensor([[1.0, 0.5, 0.0]]), -1))


def test_top_k_keeps_k_and_renormalises() -> None:
    got = sampling_logprobs(_logits([0.4, 0.3, 0.2, 0.1]), 1.0, top_k=2)
    expected = torch.tensor([[math.log(4 / 7), math.log(3 / 7), -math.inf, -math.inf]])
    torch.testing.assert_close(got, expected)


def test_top_p_keeps_the_token_that_crosses_p() -> None:
    probs = [0.5, 0.3, 0.15, 0.05]
    got = sampling_logprobs(_logits(probs), 1.0, top_p=0.75)
    expected = torch.tensor([[math.log(0.5 / 0.8), math.log(0.3 / 0.8), -math.inf, -math.inf]])
    torch.testing.assert_close(got, expected)
    only_first = sampling_logprobs(_logits(probs), 1.0, top_p=0.4)
    assert only_first[0, 0].item() == pytest.approx(0.0)
    assert torch.isinf(only_first[0, 1:]).all()


def test_top_p_applies_after_top_k() -> None:
    # On the full distribution p=0.5 keeps two tokens; after top-k=2 renormalises to
    # (4/7, 3/7), the first alone reaches 0.5.
    got = sampling_logprobs(_logits([0.4, 0.3, 0.2, 0.1]), 1.0, top_k=2, top_p=0.5)
    assert got[0, 0].item() == pytest.approx(0.0)
    assert torch.isinf(got[0, 1:]).all()


def test_greedy_uses_untempered_untruncated_distribution() -> None:
    logits = torch.tensor([[3.0, 1.0, 0.5]])
    got = sampling_logprobs(logits, 0.0, top_k=1, top_p=0.1)
    torch.testing.assert_close(got, torch.log_softmax(logits, -1))


def test_per_row_parameters() -> None:
    logits = _logits([0.4, 0.3, 0.2, 0.1]).repeat(3, 1)
    got = sampling_logprobs(
        logits,
        torch.tensor([1.0, 1.0, 0.0]),
        torch.tensor([0, 2, 2]),
        torch.tensor([1.0, 1.0, 1.0]),
    )
    torch.testing.assert_close(got[0], torch.log_softmax(logits[0], -1))
    assert torch.isinf(got[1, 2:]).all()
    torch.testing.assert_close(got[2], torch.log_softmax(logits[2], -1))  # greedy row


def test_ties_at_the_top_k_boundary_keep_the_lower_id() -> None:
    got = sampling_logprobs(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 1.0, top_k=2)
    assert torch.isfinite(got[0, 1]) and torch.isfinite(got[0, 2])
    got = sampling_logprobs(torch.tensor([[2.0, 2.0, 2.0]]), 1.0, top_k=1)
    assert got[0].tolist() == [0.0, -math.inf, -math.inf]


def test_draw_never_samples_truncated_tokens_and_is_seeded() -> None:
    logp = sampling_logprobs(_logits([0.4, 0.3, 0.2, 0.1]).repeat(2, 1), 1.0, top_k=2)

    def run(seed: int) -> list[int]:
        gens = [torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)]
        out = []
        for _ in range(200):
            tokens, token_logp = draw(logp, [False, False], gens)
            assert torch.isfinite(token_logp).all()
            out.extend(tokens.tolist())
        return out

    first = run(7)
    assert set(first) == {0, 1}
    assert run(7) == first


def test_draws_follow_the_distribution_and_skip_zero_mass() -> None:
    """20,000 draws land on each token as often as its probability says (within 4 standard
    errors), never on a token of mass 0, whether the zeros lie first, between or last."""
    probs = [0.0, 0.1, 0.0, 0.6, 0.3, 0.0]
    logp = torch.tensor([probs]).log()
    gen = torch.Generator().manual_seed(3)
    counts = [0] * len(probs)
    for _ in range(20_000):
        tokens, _ = draw(logp, [False], [gen])
        counts[int(tokens[0])] += 1
    for p, c in zip(probs, counts, strict=True):
        if p == 0:
            assert c == 0
        else:
            assert abs(c / 20_000 - p) < 4 * math.sqrt(p * (1 - p) / 20_000)


def test_a_row_draws_the_same_whatever_shares_its_batch() -> None:
    logp = torch.log_softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(1)), -1)
    alone = draw(logp[1:2], [False], [torch.Generator().manual_seed(5)])[0]
    together = draw(
        logp, [False, False, True],
        [torch.Generator().manual_seed(9), torch.Generator().manual_seed(5), torch.Generator()],
    )[0]  # fmt: skip
    assert together[1] == alone[0]
    assert together[2] == logp[2].argmax()


def test_draw_greedy_takes_argmax() -> None:
    logits = torch.tensor([[0.1, 3.0, 0.2]])
    tokens, token_logp = draw(torch.log_softmax(logits, -1), [True], [torch.Generator()])
    assert tokens.tolist() == [1]
    assert token_logp.item() == pytest.approx(torch.log_softmax(logits, -1)[0, 1].item())


def test_token_logprobs_gathers_targets_with_any_leading_shape() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0, 4, 2], [1, 1, 3]])
    got = token_logprobs(logits, targets, temperature=0.5)
    expected = torch.log_softmax(logits / 0.5, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(got, expected)
