"""A meta-episode as one training sequence (the conversation prompt layout): its record and sample.

In the conversation layout (SPEC §2) a meta-episode is one growing chat whose token ids
are the source of truth (:mod:`mage_rl.policy.conversation`). Its record keeps those ids
once, and for each LLM call the span of the ids that holds the call's response. The
learner then trains the meta-episode as one sequence
(:func:`mage_rl.rl.batching.conversation_sample`): each span takes its turn's advantage,
sampling log-probs and allowed sets; every other token is context.

:class:`ConversationSample` is what the learner trains: the ids with one
:class:`Segment` per call, each carrying its advantage, sampling log-probs and allowed
sets (:mod:`mage_rl.rl.batching` lays it out for the forward pass).

A record carries its trace as an attribute ``conversation`` holding a
:class:`ConversationTrace` (or its :meth:`ConversationTrace.to_dict` form, as read back
from JSON lines); a record without one, or with ``None``, trains call by call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class ConversationTrace:
    """A meta-episode's conversation: its ids and where each call's response sits.

    Attributes:
        ids: Every token of the conversation, up to the end of its last response at
            least.
        segments: ``(start, end, turn_index)`` per call in the conversation, in order:
            ``ids[start:end]`` is the response of ``record.turns[turn_index]`` exactly as
            sampled, and ``ids[:start]`` was that call's prompt.
    """

    ids: Sequence[int]
    segments: Sequence[tuple[int, int, int]]

    def __post_init__(self) -> None:
        previous_end = 1
        for start, end, turn in self.segments:
            if start < previous_end or end <= start or end > len(self.ids) or turn < 0:
                raise ValueError(
                    f"conversation segment ({start}, {end}, turn {turn}) is empty, out of "
                    f"order, overlaps the one before or runs past the {len(self.ids)} ids; "
                    "segments are the sampled responses, in call order, after the first prompt"
                )
            previous_end = end

    @classmethod
    def from_conversation(
        cls, conversation: Any, turn_indices: Sequence[int] | None = None
    ) -> ConversationTrace:
        """The trace of a :class:`~mage_rl.policy.conversation.Conversation`.

        Args:
            conversation: Anything with ``ids`` and ``segments`` (``(start, end)`` pairs).
            turn_indices: The record turn of each segment; default ``0, 1, 2, ...``
                (every turn of the record is a call of this conversation, in order).
        """
        spans = [(int(s), int(e)) for s, e in conversation.segments]
        turns = range(len(spans)) if turn_indices is None else turn_indices
        if len(turns) != len(spans):
            raise ValueError(
                f"the conversation has {len(spans)} responses but {len(turns)} turn indices"
            )
        segments = [(s, e, int(t)) for (s, e), t in zip(spans, turns, strict=True)]
        return cls(ids=[int(i) for i in conversation.ids], segments=segments)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ids": list(self.ids), "segments": [list(seg) for seg in self.segments]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConversationTrace:
        """Inverse of :meth:`to_dict`."""
        segments = [(int(s), int(e), int(t)) for s, e, t in data["segments"]]
        return cls(ids=[int(i) for i in data["ids"]], segments=segments)


def record_conversation(record: Any) -> ConversationTrace | None:
    """The :class:`ConversationTrace` a record carries, or ``None`` when it trains call by call.

    Raises:
        TypeError: If the record's ``conversation`` is neither a trace, its dict form nor
            ``None``.
    """
    value = getattr(record, "conversation", None)
    if value is None or isinstance(value, ConversationTrace):
        return value
    if isinstance(value, dict):
        return ConversationTrace.from_dict(value)
    raise TypeError(
        f"record {getattr(record, 'uid', '?')!r} has a conversation of type "
        f"{type(value).__name__}; store a ConversationTrace or its to_dict() form"
    )


@dataclass(frozen=True)
class Segment:
    """One assistant response inside a :class:`ConversationSample`.

    Attributes:
        start: Index of the response's first token in the conversation's ids; the
            tokens before it were the call's prompt.
        end: One past its last token.
        old_logprobs: Sampling log-probs of ``ids[start:end]``.
        advantage: The call's advantage, applied to each of its tokens.
        allowed: Allowed ids of every position when the call used constrained
            decoding; empty otherwise.
    """

    start: int
    end: int
    old_logprobs: Sequence[float]
    advantage: float
    allowed: Sequence[Sequence[int]] = ()

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ConversationSample:
    """A meta-episode as one training sequence (the conversation prompt layout).

    Attributes:
        ids: The conversation's token ids.
        segments: The assistant responses to train, in order, not overlapping; tokens
            outside them are context and take no loss. Tokens after the last segment
            are not even fed to the model.
    """

    ids: Sequence[int]
    segments: Sequence[Segment]

    @property
    def length(self) -> int:
        """Tokens fed to the model: up to the end of the last segment."""
        return max((seg.end for seg in self.segments), default=0)

    @property
    def num_response_tokens(self) -> int:
        """Tokens the loss is taken over (every segment's)."""
        return sum(seg.length for seg in self.segments)

    @property
    def num_calls(self) -> int:
        """LLM calls the sample trains: one per segment."""
        return len(self.segments)

    def with_old_logprobs(self, logprobs: Sequence[float]) -> ConversationSample:
        """A copy whose segments take these log-probs, concatenated in segment order.

        The layout :meth:`~mage_rl.rl.learner.Learner.compute_logprobs` returns.
        """
        if len(logprobs) != self.num_response_tokens:
            raise ValueError(
                f"got {len(logprobs)} log-probs for {self.num_response_tokens} segment tokens"
            )
        segments, at = [], 0
        for seg in self.segments:
            segments.append(replace(seg, old_logprobs=list(logprobs[at : at + seg.length])))
            at += seg.length
        return ConversationSample(self.ids, segments)

    def ids_only(self) -> ConversationSample:
        """A copy with zero log-probs and advantages, for scoring the ids alone."""
        return ConversationSample(
            self.ids,
            [replace(seg, old_logprobs=[0.0] * seg.length, advantage=0.0) for seg in self.segments],
        )

    def validate(self, index: int) -> None:
        """Raise ``ValueError`` with a fix if the sample cannot be trained on."""
        previous_end = 1  # the first trained token needs one token of context before it
        for k, seg in enumerate(self.segments):
            where = f"conversation sample {index} segment {k} [{seg.start}, {seg.end})"
            if seg.start < previous_end or seg.end <= seg.start or seg.end > len(self.ids):
                raise ValueError(
                    f"{where} is empty, out of order, overlaps the one before or runs past "
                    f"the {len(self.ids)} ids; segments are the sampled responses, in "
                    "order, after at least one prompt token"
                )
            previous_end = seg.end
            if len(seg.old_logprobs) != seg.length:
                raise ValueError(
                    f"{where} has {seg.length} tokens but {len(seg.old_logprobs)} log-probs; "
                    "the rollout backend must return one sampling log-prob per response token"
                )
            if seg.allowed:
                if len(seg.allowed) != seg.length:
                    raise ValueError(
                        f"{where} has {seg.length} tokens but {len(seg.allowed)} allowed sets; "
                        "constrained responses need one per token"
                    )
                tokens = self.ids[seg.start : seg.end]
                for j, (token, ids) in enumerate(zip(tokens, seg.allowed, strict=True)):
                    if ids and token not in ids:
                        raise ValueError(
                            f"{where}: token {j} ({token}) is not in its allowed set "
                            f"{list(ids)}; the record does not match constrained decoding"
                        )
