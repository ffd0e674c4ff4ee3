"""Training samples and how the learner batches them.

A :class:`Sample` is one LLM call ready for the policy update: prompt and response token
ids, the sampling log-probs of the response, and one advantage spread over the response
tokens. The learner splits a batch of samples into mini-batches (one optimizer step
each) and every mini-batch into micro-batches under a padded-token budget (gradient
accumulation), then right-pads each micro-batch into ``(B, T)`` tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mage_rl.policy.constrained import allowed_index
from mage_rl.records import MetaEpisodeRecord


@dataclass(frozen=True)
class Sample:
    """One training sample.

    Attributes:
        prompt_ids: Prompt token ids (at least one: the first response token is scored
            from the logits at the last prompt position).
        response_ids: Sampled response token ids.
        old_logprobs: Log-probs of ``response_ids`` under the sampling policy.
        advantage: Advantage of the sample, applied to each of its response tokens.
        allowed: For a response sampled with constrained decoding, the allowed token ids
            of every response position (:mod:`mage_rl.policy.constrained`); the learner
            then scores each token under the restricted softmax. Empty: unrestricted.
    """

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    old_logprobs: Sequence[float]
    advantage: float
    allowed: Sequence[Sequence[int]] = ()

    @classmethod
    def coerce(cls, item: Any) -> Sample:
        """Accept a :class:`Sample` or a ``(prompt_ids, response_ids, old_logprobs, adv)`` tuple."""
        if isinstance(item, Sample):
            return item
        try:
            prompt_ids, response_ids, old_logprobs, advantage = item
        except (TypeError, ValueError) as err:
            raise TypeError(
                "a training sample must be a Sample or a 4-tuple "
                f"(prompt_ids, response_ids, old_logprobs, advantage), got {type(item).__name__}"
            ) from err
        return cls(list(prompt_ids), list(response_ids), list(old_logprobs), float(advantage))

    def validate(self, index: int) -> None:
        """Raise ``ValueError`` with a fix if the sample cannot be trained on."""
        if not self.prompt_ids:
            raise ValueError(
                f"sample {index} has no prompt tokens; the first response token is scored "
                "from the last prompt position, so render prompts with at least one token "
                "(e.g. the chat template or a BOS token)"
            )
        if len(self.old_logprobs) != len(self.response_ids):
            raise ValueError(
                f"sample {index} has {len(self.response_ids)} response tokens but "
                f"{len(self.old_logprobs)} log-probs; the rollout backend must return one "
                "sampling log-prob per response token"
            )
        if self.allowed:
            if len(self.allowed) != len(self.response_ids):
                raise ValueError(
                    f"sample {index} has {len(self.response_ids)} response tokens but "
                    f"{len(self.allowed)} allowed sets; constrained responses need one per token"
                )
            for j, (token, ids) in enumerate(zip(self.response_ids, self.allowed, strict=True)):
                if ids and token not in ids:
                    raise ValueError(
                        f"sample {index}: response token {j} ({token}) is not in its allowed "
                        f"set {list(ids)}; the record does not match constrained decoding"
                    )

    @property
    def length(self) -> int:
        """Prompt plus response tokens."""
        return len(self.prompt_ids) + len(self.response_ids)


def samples_from_records(
    records: Sequence[MetaEpisodeRecord], advantages: Sequence[Sequence[float]]
) -> list[Sample]:
    """Pair every trained turn with its advantage (from
    :func:`~mage_rl.rl.advantages.compute_advantages`).

    Turns a node marked ``trained=False`` are credited (they took part in the returns and
    baselines) but give no sample.

    Raises:
        ValueError: If the shapes disagree or a turn carries no token ids or log-probs
            (remote backends that return text only cannot be trained on).
    """
    if len(records) != len(advantages):
        raise ValueError(f"got {len(records)} records but {len(advantages)} advantage lists")
    samples = []
    for record, advs in zip(records, advantages, strict=True):
        if len(advs) != len(record.turns):
            raise ValueError(
                f"record {record.uid!r} (rollout {record.rollout}) has {len(record.turns)} "
                f"turns but {len(advs)} advantages"
            )
        for j, (turn, adv) in enumerate(zip(record.turns, advs, strict=True)):
            if not turn.trained:
                continue
            if not turn.response_ids or len(turn.logprobs) != len(turn.response_ids):
                raise ValueError(
                    f"record {record.uid!r} (rollout {record.rollout}) turn {j} has "
                    f"{len(turn.response_ids)} response ids and {len(turn.logprobs)} log-probs; "
                    "training needs a policy backend that returns token ids and sampling "
                    "log-probs (the local engine or vLLM, not a text-only endpoint)"
                )
            samples.append(
                Sample(turn.prompt_ids, turn.response_ids, turn.logprobs, float(adv), turn.allowed)
            )
    return samples


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


@dataclass
class MicroBatch:
    """Right-padded tensors of one micro-batch.

    Attributes:
        input_ids: Prompt and response tokens, right-padded, ``(B, T)`` int64.
        attention_mask: 1 on real tokens, ``(B, T)`` int64.
        positions: For response token ``j`` of row ``b``, the input position whose logits
            predict it, ``prompt_len_b - 1 + j``; 0 on padding, ``(B, R)`` int64.
        response_ids: Response tokens, right-padded, ``(B, R)`` int64.
        old_logprobs: Sampling log-probs, ``(B, R)`` float32.
        advantages: Per-token advantages, ``(B, R)`` float32.
        mask: 1 on valid response tokens, ``(B, R)`` float32.
        min_prompt_len: Shortest prompt of the batch (logits before it are not needed).
        allowed_index: Allowed ids of constrained positions, ``(B, R, A)`` int64 padded
            with -1, or ``None`` when no sample was constrained.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor
    response_ids: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    min_prompt_len: int
    allowed_index: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Valid response tokens."""
        return int(self.mask.sum().item())

    def to(self, device: torch.device) -> MicroBatch:
        """Move every tensor to ``device``."""
        moved = {
            name: getattr(self, name).to(device)
            for name in (
                "input_ids",
                "attention_mask",
                "positions",
                "response_ids",
                "old_logprobs",
                "advantages",
                "mask",
            )
        }
        allowed = None if self.allowed_index is None else self.allowed_index.to(device)
        return MicroBatch(**moved, min_prompt_len=self.min_prompt_len, allowed_index=allowed)


def collate(samples: Sequence[Sample], pad_id: int = 0) -> MicroBatch:
    """Right-pad samples into a :class:`MicroBatch` (padding is masked out, any id works)."""
    batch = len(samples)
    width = max(s.length for s in samples)
    resp_width = max(len(s.response_ids) for s in samples)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    positions = torch.zeros((batch, resp_width), dtype=torch.long)
    response_ids = torch.full((batch, resp_width), pad_id, dtype=torch.long)
    old_logprobs = torch.zeros((batch, resp_width), dtype=torch.float32)
    advantages = torch.zeros((batch, resp_width), dtype=torch.float32)
    mask = torch.zeros((batch, resp_width), dtype=torch.float32)
    for b, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[b, : p + r] = torch.tensor([*s.prompt_ids, *s.response_ids], dtype=torch.long)
        attention_mask[b, : p + r] = 1
        positions[b, :r] = torch.arange(p - 1, p - 1 + r)
        response_ids[b, :r] = torch.tensor(list(s.response_ids), dtype=torch.long)
        old_logprobs[b, :r] = torch.tensor(list(s.old_logprobs), dtype=torch.float32)
        advantages[b, :r] = float(s.advantage)
        mask[b, :r] = 1.0
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        positions=positions,
        response_ids=response_ids,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        min_prompt_len=min(len(s.prompt_ids) for s in samples),
        allowed_index=allowed_index([s.allowed for s in samples], resp_width),
    )
