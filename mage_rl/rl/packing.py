"""How the learner cuts a batch: mini-batches of LLM calls, micro-batches of padded tokens.

Pure index arithmetic over sample sizes, used by :class:`~mage_rl.rl.learner.Learner`;
the samples themselves are in :mod:`mage_rl.rl.batching`.
"""

from __future__ import annotations

from collections.abc import Sequence


def cut_mini_batches(
    order: Sequence[int], calls: Sequence[int], mini_batch_size: int
) -> list[list[int]]:
    """Cut samples, taken in ``order``, into mini-batches of at most ``mini_batch_size`` calls.

    A sample counts its LLM calls (1 for a :class:`Sample`, one per segment for a
    :class:`ConversationSample`) and is never split, so a conversation with more calls
    than the size gets a mini-batch of its own. With per-call samples only, this is
    plain chunking of ``order``.

    Args:
        order: Sample indices in the order to take them (shuffled by the learner).
        calls: LLM calls per sample, indexed like the samples.
        mini_batch_size: Most calls per mini-batch (>= 1).

    Returns:
        Lists of indices; every index of ``order`` appears exactly once, in order.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    count = 0
    for i in order:
        if current and count + calls[i] > mini_batch_size:
            batches.append(current)
            current, count = [], 0
        current.append(i)
        count += calls[i]
    if current:
        batches.append(current)
    return batches


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sample indices into micro-batches whose padded size fits the budget.

    Samples are taken longest first, so that each micro-batch holds similar lengths and
    little padding; a micro-batch of ``n`` samples costs ``n * max_length`` tokens. A
    sample longer than the budget gets a micro-batch of its own.

    Args:
        lengths: Total tokens (prompt + response) per sample.
        token_budget: Maximum padded tokens per micro-batch.

    Returns:
        Lists of indices into ``lengths``; every index appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Longest first: the first sample of a micro-batch sets its padded width.
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
