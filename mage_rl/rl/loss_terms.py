"""Extra terms of the learner's loss, registered by name (``learner.loss_terms``).

The learner's loss is MAGE's (SPEC §6): the PPO-clip surrogate, the entropy bonus and
the KL to the reference. A study or a user who needs another term (an auxiliary loss, a
regulariser) registers a function and lists its name in ``learner.loss_terms``, without
changing the package::

    from mage_rl.rl.loss import token_mean
    from mage_rl.rl.loss_terms import register_loss_term

    def short_answers(x):
        # 0.01 x the mean log-prob of the sampled tokens: pushes toward fewer, surer tokens
        return -0.01 * token_mean(x.logprobs, x.mask, x.num_tokens)

    register_loss_term("short_answers", short_answers)

Each term gets a :class:`LossInputs` per micro-batch and returns a scalar tensor (weighted
by the function itself) that is added to the loss before the backward pass; its value is
reported as ``term/<name>`` in the update's statistics (``losses/term/<name>`` in the
run's metrics). Load the module with ``--plugin`` or a config's ``plugins:`` list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mage_rl.sections import LOSS_TERMS


@dataclass(frozen=True)
class LossInputs:
    """What a loss term sees of one micro-batch (tensors on the learner's device).

    Attributes:
        logits: ``(B, R, V)`` logits of the response positions, divided by the sampling
            temperature.
        logprobs: ``(B, R)`` log-probs of the sampled tokens under the current policy
            (restricted to the allowed tokens under constrained decoding).
        old_logprobs: ``(B, R)`` log-probs the tokens were sampled with.
        advantages: ``(B, R)`` advantage of each token.
        mask: ``(B, R)`` 1 for trained response tokens, 0 for padding and untrained calls.
        allowed_index: ``(B, R, A)`` allowed token ids per position under constrained
            decoding (-1 pads), or ``None``.
        num_tokens: The mini-batch's trained token count, the denominator of token means
            (:func:`~mage_rl.rl.loss.token_mean`), so that a term weighs the same
            however the mini-batch is cut into micro-batches.
    """

    logits: Any
    logprobs: Any
    old_logprobs: Any
    advantages: Any
    mask: Any
    allowed_index: Any
    num_tokens: int


def register_loss_term(
    name: str, fn: Callable[[LossInputs], Any], *, replace: bool = False
) -> None:
    """Register ``fn(inputs) -> scalar tensor`` as the loss term ``name``.

    Raises:
        ValueError: ``name`` is taken (unless ``replace``).
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"register_loss_term({name!r}): give a function, got {fn!r}")
    LOSS_TERMS.register(name, fn, replace=replace)
