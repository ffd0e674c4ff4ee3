"""Training samples and how the learner batches them.

A :class:`Sample` is one LLM call ready for the policy update: prompt and response token
ids, the sampling log-probs of the response, and one advantage spread over the response
tokens. A :class:`ConversationSample` is a whole meta-episode in the conversation prompt
layout (SPEC §2): one token sequence holding several assistant :class:`Segment` spans,
each with its own advantage, old log-probs and allowed sets; every other token is
context only. The learner splits a batch of samples into mini-batches (one optimizer
step each) and every mini-batch into micro-batches under a padded-token budget (gradient
accumulation), then right-pads each micro-batch into ``(B, T)`` tensors.

Both kinds become the same :class:`MicroBatch` rows: the input tokens and, for every
trained token, the position whose logits predict it. A segment ``[start, end)`` of a
conversation is scored exactly as a :class:`Sample` whose prompt is ``ids[:start]`` and
whose response is ``ids[start:end]`` (causal attention sees the same prefix), so with the
token-mean loss one conversation trains exactly like its calls trained one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from mage_rl.policy.constrained import allowed_index, mixture_logprobs
from mage_rl.records import MetaEpisodeRecord, Turn
from mage_rl.rl import prefix_tree
from mage_rl.rl.conversation import (
    ConversationSample,
    ConversationTrace,
    Segment,
    record_conversation,
)
from mage_rl.rl.prefix_tree import build_prefix_tree


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

    @property
    def num_response_tokens(self) -> int:
        """Tokens the loss is taken over."""
        return len(self.response_ids)

    @property
    def num_calls(self) -> int:
        """LLM calls the sample trains (what ``mini_batch_size`` counts): one."""
        return 1

    def with_old_logprobs(self, logprobs: Sequence[float]) -> Sample:
        """A copy whose response tokens take these sampling log-probs."""
        return replace(self, old_logprobs=list(logprobs))

    def ids_only(self) -> Sample:
        """A copy with zero log-probs and advantage, for scoring the ids alone."""
        return Sample(
            self.prompt_ids, self.response_ids, [0.0] * len(self.response_ids), 0.0, self.allowed
        )


TrainingSample = Sample | ConversationSample


def behaviour_logprobs(
    sample: TrainingSample, logprobs: Sequence[float], explore: float
) -> list[float]:
    """The sampling log-probs of a sample drawn with ``policy.explore``, from the policy's.

    ``logprobs`` are the policy's log-probs of the sample's trained tokens (the layout of
    :meth:`~mage_rl.rl.learner.Learner.compute_logprobs`); at each position with several
    allowed tokens the result is the exploration mixture's log-prob, what the engine
    sampled from (:func:`~mage_rl.policy.constrained.mixture_logprobs`).
    """
    if explore <= 0:
        return list(logprobs)
    if isinstance(sample, ConversationSample):
        allowed = [
            seg.allowed[j] if j < len(seg.allowed) else ()
            for seg in sample.segments
            for j in range(seg.length)
        ]
    else:
        allowed = [
            sample.allowed[j] if j < len(sample.allowed) else ()
            for j in range(len(sample.response_ids))
        ]
    if len(allowed) != len(logprobs):
        raise ValueError(f"got {len(logprobs)} log-probs for {len(allowed)} trained tokens")
    mixed = mixture_logprobs(
        torch.tensor(list(logprobs), dtype=torch.float64),
        torch.tensor([len(a) for a in allowed]),
        explore,
    )
    return mixed.tolist()


@dataclass(frozen=True)
class _Row:
    """What :func:`collate` needs of a sample: inputs and, per trained token, its position."""

    input_ids: list[int]
    positions: list[int]  # position whose logits predict each trained token
    old_logprobs: list[float]
    advantages: list[float]
    allowed: list[list[int]]


def _row(sample: TrainingSample) -> _Row:
    """A sample as one micro-batch row; a conversation's segments are all targets."""
    if isinstance(sample, Sample):
        p, r = len(sample.prompt_ids), len(sample.response_ids)
        return _Row(
            input_ids=[*sample.prompt_ids, *sample.response_ids],
            positions=list(range(p - 1, p - 1 + r)),
            old_logprobs=list(sample.old_logprobs),
            advantages=[float(sample.advantage)] * r,
            allowed=[list(a) for a in sample.allowed] if sample.allowed else [],
        )
    positions: list[int] = []
    old: list[float] = []
    advantages: list[float] = []
    allowed: list[list[int]] = []
    constrained = any(seg.allowed for seg in sample.segments)
    for seg in sample.segments:
        positions.extend(range(seg.start - 1, seg.end - 1))
        old.extend(float(x) for x in seg.old_logprobs)
        advantages.extend([float(seg.advantage)] * seg.length)
        if constrained:
            # A free segment next to constrained ones: empty sets mean unrestricted.
            sets = seg.allowed or [[]] * seg.length
            allowed.extend(list(a) for a in sets)
    ids = list(sample.ids[: sample.length])
    return _Row(ids, positions, old, advantages, allowed)


def coerce_sample(item: Any) -> TrainingSample:
    """A :class:`ConversationSample`, or anything :meth:`Sample.coerce` accepts."""
    if isinstance(item, ConversationSample):
        return item
    return Sample.coerce(item)


def samples_from_records(
    records: Sequence[MetaEpisodeRecord],
    advantages: Sequence[Sequence[float]],
) -> list[TrainingSample]:
    """Pair every trained turn with its advantage (from
    :func:`~mage_rl.rl.advantages.compute_advantages`).

    Turns a node marked ``trained=False`` are credited (they took part in the returns and
    baselines) but give no sample, and no segment of a conversation sample.

    A record without a conversation gives one :class:`Sample` per turn, in turn order. A
    record that carries one (its ``conversation`` attribute, a
    :class:`~mage_rl.rl.conversation.ConversationTrace`) gives one
    :class:`ConversationSample` for the turns its segments cover, followed by a
    :class:`Sample` for each turn it does not cover.

    Raises:
        ValueError: If the shapes disagree or a turn carries no token ids or log-probs
            (remote backends that return text only cannot be trained on).
    """
    if len(records) != len(advantages):
        raise ValueError(f"got {len(records)} records but {len(advantages)} advantage lists")
    return [
        sample
        for record, advs in zip(records, advantages, strict=True)
        for sample, _ in record_samples(record, advs)
    ]


def record_samples(
    record: MetaEpisodeRecord,
    advantages: Sequence[float],
) -> list[tuple[TrainingSample, list[int]]]:
    """One record's samples (see :func:`samples_from_records`), each with the turns it trains.

    Returns:
        ``(sample, turn_indices)`` pairs: the conversation sample (if any) with its
        segments' turns, then one pair per turn trained on its own.
    """
    if len(advantages) != len(record.turns):
        raise ValueError(
            f"record {record.uid!r} (rollout {record.rollout}) has {len(record.turns)} "
            f"turns but {len(advantages)} advantages"
        )
    for j, turn in enumerate(record.turns):
        if turn.trained:
            _check_turn_tokens(record, j, turn)
    out: list[tuple[TrainingSample, list[int]]] = []
    trace = record_conversation(record)
    covered: set[int] = set()
    if trace is not None:
        conversation = conversation_sample(trace, record.turns, advantages, record.uid)
        out.append((conversation, [turn for _, _, turn in trace.segments]))
        covered = set(out[0][1])
    for j, (turn, adv) in enumerate(zip(record.turns, advantages, strict=True)):
        if j not in covered and turn.trained:
            sample = Sample(
                turn.prompt_ids, turn.response_ids, turn.logprobs, float(adv), turn.allowed
            )
            out.append((sample, [j]))
    return out


def conversation_sample(
    trace: ConversationTrace,
    turns: Sequence[Turn],
    advantages: Sequence[float],
    uid: str = "",
) -> ConversationSample:
    """The training sequence of a meta-episode recorded in the conversation layout.

    Args:
        trace: The conversation's ids and its ``(start, end, turn_index)`` segments.
        turns: The record's turns; segment ``(s, e, j)`` trains ``turns[j]``, whose
            ``response_ids`` must equal ``trace.ids[s:e]``. Its sampling log-probs and
            allowed sets come from the turn.
        advantages: One advantage per turn (all of ``turns``, covered or not).
        uid: The record's uid, for error messages.

    Returns:
        A :class:`ConversationSample` with one segment per trace segment, in order.

    Raises:
        ValueError: If a segment names a missing turn, two segments name the same turn,
            or a segment's ids are not its turn's response.
    """
    if len(advantages) != len(turns):
        raise ValueError(f"got {len(turns)} turns but {len(advantages)} advantages")
    segments = []
    seen: set[int] = set()
    for start, end, j in trace.segments:
        where = f"record {uid!r}: conversation segment [{start}, {end}) of turn {j}"
        if not 0 <= j < len(turns) or j in seen:
            raise ValueError(
                f"{where} names a turn that does not exist or another segment already "
                f"trains (the record has {len(turns)} turns)"
            )
        seen.add(j)
        turn = turns[j]
        if list(trace.ids[start:end]) != list(turn.response_ids):
            raise ValueError(
                f"{where} does not hold that turn's response ids; record the conversation "
                "with the ids exactly as sampled, one segment per call"
            )
        if turn.trained:  # an untrained call stays in the context, masked out of the loss
            advantage = float(advantages[j])
            segments.append(Segment(start, end, turn.logprobs, advantage, turn.allowed))
    return ConversationSample(trace.ids, segments)


def _check_turn_tokens(record: MetaEpisodeRecord, j: int, turn: Turn) -> None:
    if not turn.response_ids or len(turn.logprobs) != len(turn.response_ids):
        raise ValueError(
            f"record {record.uid!r} (rollout {record.rollout}) turn {j} has "
            f"{len(turn.response_ids)} response ids and {len(turn.logprobs)} log-probs; "
            "training needs a policy backend that returns token ids and sampling "
            "log-probs (the local engine or vLLM, not a text-only endpoint)"
        )


@dataclass
class MicroBatch:
    """Right-padded tensors of one micro-batch.

    Attributes:
        input_ids: Prompt and response tokens, right-padded, ``(B, T)`` int64.
        attention_mask: 1 on real tokens, ``(B, T)`` int64.
        positions: For trained token ``j`` of row ``b``, the input position whose logits
            predict it (``prompt_len_b - 1 + j`` for a :class:`Sample`); 0 on padding,
            ``(B, R)`` int64.
        response_ids: Trained tokens, right-padded, ``(B, R)`` int64.
        old_logprobs: Sampling log-probs, ``(B, R)`` float32.
        advantages: Per-token advantages, ``(B, R)`` float32.
        mask: 1 on valid response tokens, ``(B, R)`` float32.
        min_prompt_len: Shortest prompt of the batch (logits before it are not needed).
        allowed_index: Allowed ids of constrained positions, ``(B, R, A)`` int64 padded
            with -1, or ``None`` when no sample was constrained.
        conversation: Whether a row is a :class:`ConversationSample`: the learner then
            asks the model for the logits of ``positions`` only, since most positions of
            a conversation are context between segments.
        position_ids: For a batch packed as a prefix tree (:func:`collate_tree`), each
            node's position, ``(1, N)``; ``input_ids`` is then the one packed row,
            ``attention_mask`` the tree's ``(1, 1, N, N)`` mask, and ``positions`` the
            node whose logits predict each trained token of each sample. ``None`` for
            right-padded rows.
        tree_paths: For a tree whose attention runs along its paths
            (:meth:`~mage_rl.rl.prefix_tree.PrefixTree.attends_along_paths`), its
            ``(index, owner)`` (:meth:`~mage_rl.rl.prefix_tree.PrefixTree.path_index`),
            passed to the model for :mod:`mage_rl.rl.path_attention`; ``None`` otherwise.
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
    conversation: bool = False
    position_ids: torch.Tensor | None = None
    tree_paths: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def tree(self) -> bool:
        """Whether the batch is one packed prefix tree."""
        return self.position_ids is not None

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
        position_ids = None if self.position_ids is None else self.position_ids.to(device)
        paths = None
        if self.tree_paths is not None:
            paths = (self.tree_paths[0].to(device), self.tree_paths[1].to(device))
        return MicroBatch(
            **moved,
            min_prompt_len=self.min_prompt_len,
            allowed_index=allowed,
            conversation=self.conversation,
            position_ids=position_ids,
            tree_paths=paths,
        )


def sequence_ids(sample: TrainingSample) -> list[int]:
    """The tokens a sample feeds the model (a conversation up to its last segment)."""
    return _row(sample).input_ids


def collate(samples: Sequence[TrainingSample], pad_id: int = 0) -> MicroBatch:
    """Right-pad samples into a :class:`MicroBatch` (padding is masked out, any id works).

    A :class:`Sample` row holds its prompt and response and trains the response; a
    :class:`ConversationSample` row holds the conversation up to its last segment and
    trains every segment (``positions`` then jumps over the context between segments).
    """
    rows = [_row(s) for s in samples]
    batch = len(rows)
    width = max(len(r.input_ids) for r in rows)
    resp_width = max(len(r.positions) for r in rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    positions = torch.zeros((batch, resp_width), dtype=torch.long)
    response_ids = torch.full((batch, resp_width), pad_id, dtype=torch.long)
    old_logprobs = torch.zeros((batch, resp_width), dtype=torch.float32)
    advantages = torch.zeros((batch, resp_width), dtype=torch.float32)
    mask = torch.zeros((batch, resp_width), dtype=torch.float32)
    index = allowed_index([r.allowed for r in rows], resp_width)
    for b, row in enumerate(rows):
        n, r = len(row.input_ids), len(row.positions)
        ids = torch.tensor(row.input_ids, dtype=torch.long)
        pos = torch.tensor(row.positions, dtype=torch.long)
        input_ids[b, :n] = ids
        attention_mask[b, :n] = 1
        positions[b, :r] = pos
        response_ids[b, :r] = ids[pos + 1]
        old_logprobs[b, :r] = torch.tensor(row.old_logprobs, dtype=torch.float32)
        advantages[b, :r] = torch.tensor(row.advantages, dtype=torch.float32)
        mask[b, :r] = 1.0
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        positions=positions,
        response_ids=response_ids,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        min_prompt_len=min(r.positions[0] + 1 if r.positions else len(r.input_ids) for r in rows),
        allowed_index=index,
        conversation=any(isinstance(s, ConversationSample) for s in samples),
    )


def collate_tree(samples: Sequence[TrainingSample], pad_id: int = 0) -> MicroBatch:
    """Pack samples as one prefix tree (:mod:`mage_rl.rl.prefix_tree`) into a
    :class:`MicroBatch` whose trained-token tensors are laid out as :func:`collate`'s.

    Shared prefixes are fed once; each trained token's logits are read at the tree node
    of the position that predicts it, so the loss and its gradient are those of
    :func:`collate`'s rows.
    """
    rows = [_row(s) for s in samples]
    # Read at each call: `mage bench memory --tree-pad` sets it for its own process.
    tree = build_prefix_tree([r.input_ids for r in rows]).padded(
        prefix_tree.TREE_PAD_MULTIPLE, pad_id
    )
    padded = collate(samples, pad_id)  # the trained-token tensors, (B, R)
    positions = torch.zeros_like(padded.positions)
    for b, row in enumerate(rows):
        path = tree.paths[b]
        positions[b, : len(row.positions)] = torch.tensor(
            [path[p] for p in row.positions], dtype=torch.long
        )
    return replace(
        padded,
        input_ids=torch.tensor([tree.tokens], dtype=torch.long),
        attention_mask=tree.attention_mask(),
        positions=positions,
        position_ids=torch.tensor([tree.depths], dtype=torch.long),
        min_prompt_len=0,
        conversation=True,
        tree_paths=tree.path_index() if tree.attends_along_paths() else None,
    )
