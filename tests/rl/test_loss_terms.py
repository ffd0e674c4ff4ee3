"""Extra loss terms registered by name (``learner.loss_terms``)."""

from __future__ import annotations

import pytest
import torch

from mage_rl.rl.learner import Learner
from mage_rl.rl.loss import token_mean
from mage_rl.rl.loss_terms import LOSS_TERMS, register_loss_term
from mage_rl.sections import LearnerConfig


@pytest.fixture()
def term():
    seen: list[int] = []

    def sharpen(x):
        seen.append(x.num_tokens)
        return -0.5 * token_mean(x.logprobs, x.mask, x.num_tokens)

    register_loss_term("test_sharpen", sharpen, replace=True)
    yield seen
    LOSS_TERMS._entries.pop("test_sharpen", None)
    LOSS_TERMS._aliases.pop("test_sharpen", None)


def _samples():
    return [([1, 2, 3], [4, 5], [-1.0, -1.2], 0.0), ([1, 2], [6, 7, 8], [-0.9, -1.1, -1.3], 0.0)]


def test_a_registered_term_enters_the_loss_and_the_statistics(term) -> None:
    from mage_rl.policy.models import load_model

    model, _ = load_model("tiny", dtype="fp32")
    base = Learner(model, LearnerConfig(lr=1e-3, dtype="fp32", entropy_coef=0.0))
    stats = base.accumulate_gradients(_samples())
    base.model.zero_grad(set_to_none=True)
    with_term = Learner(model, LearnerConfig(lr=1e-3, dtype="fp32", entropy_coef=0.0,
                                             loss_terms=("test_sharpen",)))  # fmt: skip
    more = with_term.accumulate_gradients(_samples())
    # zero advantages: the PG loss is 0, so the loss is the term, -0.5 x the mean log-prob
    assert stats["loss"] == pytest.approx(0.0, abs=1e-6)
    assert more["loss"] == pytest.approx(more["term/test_sharpen"], abs=1e-6)
    assert more["term/test_sharpen"] > 0 and term == [5]  # one micro-batch, 5 tokens
    grads = [p.grad for p in with_term.model.parameters() if p.grad is not None]
    assert grads and any(torch.count_nonzero(g) for g in grads)  # the term has a gradient
    update = with_term.update(_samples())
    assert update["term/test_sharpen"] > 0


def test_an_unregistered_term_is_refused() -> None:
    with pytest.raises(ValueError, match=r"loss_terms names \['nope'\].*--plugin"):
        LearnerConfig(loss_terms=("nope",))
