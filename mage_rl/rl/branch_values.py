"""Advantages of every allowed token at the branch points of constrained answers.

With constrained decoding an answer is one of a few fixed strings, and it is chosen only
at its *branch points*: the response positions where more than one token is allowed
(Kuhn Poker: ``BET`` or ``PASS`` after ``<action>``). The sampled policy gradient moves
the token that was drawn there by its turn's advantage; every other allowed token moves
only through the softmax. ``advantages.choice_update: expected`` replaces that term, at
the branch points where it can, by the expected update over the allowed tokens,
``sum_a grad pi(a | s) * A(s, a)`` (the all-action policy gradient; Sutton et al. 2000,
"Policy gradient methods for reinforcement learning with function approximation";
Ciosek and Whiteson 2018, "Expected policy gradients", arXiv 1706.05374).

``A(s, a)`` is estimated from the turns themselves. A branch point is keyed by the
turn's anchor state (as GiGPO's step level keys it, without the task group, so it pools
the whole batch: the observation, the node and, under ``stationary`` grouping, the
opponent), the response tokens before the branch, and the token taken there. Its value
is the mean GiGPO advantage of the turns that took that token at that key. With
``advantages.branch_memory`` m > 0, each time a batch brings new turns for a token, its
earlier turns stay in the mean at weight ``m ** age``. A token that a batch did not take
keeps its estimate as it was: an action the policy has stopped sampling keeps the value
it showed while it was sampled, so the update can still bring it back, instead of
vanishing from the update once nothing samples it.

At a branch point with at least two estimated tokens the learner takes the expected update
(:func:`mage_rl.rl.loss.expected_branch_loss`); a token without an estimate is given the
policy-weighted mean of the others, so it is neither pushed nor pulled. Elsewhere the
sampled PPO term stays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.advantages import AdvantageConfig, record_anchor_ids


def _key(anchor: str, prefix: Sequence[int], token: int) -> str:
    return f"{anchor}|{','.join(str(int(t)) for t in prefix)}|{int(token)}"


def branch_points(turn_allowed: Sequence[Sequence[int]]) -> list[int]:
    """Response positions where more than one token was allowed."""
    return [j for j, ids in enumerate(turn_allowed) if len(ids) > 1]


class BranchValues:
    """The running table of token advantages at branch points (see the module docstring).

    Args:
        config: The advantage settings: ``grouping`` and ``anchor`` shape the keys,
            ``branch_memory`` the decay of earlier batches.
    """

    def __init__(self, config: AdvantageConfig) -> None:
        self.config = config
        self.memory = float(config.branch_memory)
        self._sum: dict[str, float] = {}
        self._weight: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._weight)

    def _anchors(self, record: MetaEpisodeRecord) -> list[str]:
        return record_anchor_ids(record, "", self.config)

    def observe(
        self, records: Sequence[MetaEpisodeRecord], advantages: Sequence[Sequence[float]]
    ) -> None:
        """Add one batch's branch-point advantages.

        A token the batch took at a branch point has its earlier turns decayed by
        ``branch_memory`` first; a token it did not take keeps its estimate as it was.
        """
        batch_sum: dict[str, float] = {}
        batch_weight: dict[str, float] = {}
        for record, advs in zip(records, advantages, strict=True):
            anchors = self._anchors(record)
            for turn, anchor, adv in zip(record.turns, anchors, advs, strict=True):
                if not turn.trained or not turn.allowed:
                    continue
                for j in branch_points(turn.allowed):
                    key = _key(anchor, turn.response_ids[:j], turn.response_ids[j])
                    batch_sum[key] = batch_sum.get(key, 0.0) + float(adv)
                    batch_weight[key] = batch_weight.get(key, 0.0) + 1.0
        for key, weight in batch_weight.items():
            self._sum[key] = self.memory * self._sum.get(key, 0.0) + batch_sum[key]
            self._weight[key] = self.memory * self._weight.get(key, 0.0) + weight

    def estimate(self, anchor: str, prefix: Sequence[int], token: int) -> float:
        """The token's mean advantage at this branch point, NaN if it was never taken."""
        key = _key(anchor, prefix, token)
        return self._sum[key] / self._weight[key] if key in self._weight else math.nan

    def annotate(self, records: Sequence[MetaEpisodeRecord]) -> list[list[list[list[float]]]]:
        """Per record, per turn, per response position: the allowed tokens' estimates.

        A position gets a list aligned with the turn's allowed set there when it is a
        branch point with at least two estimated tokens (the others NaN), and an empty
        list otherwise, which keeps the sampled term (the layout
        :func:`~mage_rl.rl.batching.samples_from_records` takes). With
        ``branch_unseen="baseline"`` one estimated token is enough: the others get 0.
        """
        baseline = self.config.branch_unseen == "baseline"
        out: list[list[list[list[float]]]] = []
        for record in records:
            anchors = self._anchors(record)
            per_turn: list[list[list[float]]] = []
            for turn, anchor in zip(record.turns, anchors, strict=True):
                if not turn.allowed:
                    per_turn.append([])
                    continue
                rows: list[list[float]] = [[] for _ in turn.response_ids]
                for j in branch_points(turn.allowed):
                    prefix = turn.response_ids[:j]
                    values = [self.estimate(anchor, prefix, t) for t in turn.allowed[j]]
                    known = sum(not math.isnan(v) for v in values)
                    if baseline and known >= 1:
                        rows[j] = [0.0 if math.isnan(v) else v for v in values]
                    elif known >= 2:
                        rows[j] = values
                per_turn.append(rows)
            out.append(per_turn)
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state, for checkpoints."""
        return {
            "memory": self.memory,
            "entries": {k: [self._sum[k], self._weight[k]] for k in sorted(self._weight)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the memory setting stays the config's)."""
        entries = state.get("entries", {})
        self._sum = {k: float(v[0]) for k, v in entries.items()}
        self._weight = {k: float(v[1]) for k, v in entries.items()}
