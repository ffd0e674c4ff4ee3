"""How a meta-episode record carries its conversation (the conversation prompt layout).

In the conversation layout (SPEC §2) a meta-episode is one growing chat whose token ids
are the source of truth (:mod:`mage_rl.policy.conversation`). Its record keeps those ids
once, and for each LLM call the span of the ids that holds the call's response. The
learner then trains the meta-episode as one sequence
(:func:`mage_rl.rl.batching.conversation_sample`): each span takes its turn's advantage,
sampling log-probs and allowed sets; every other token is context.

A record carries it as an attribute ``conversation`` holding a :class:`ConversationTrace`
(or its :meth:`ConversationTrace.to_dict` form, as read back from JSON lines); a record
without one, or with ``None``, trains call by call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
