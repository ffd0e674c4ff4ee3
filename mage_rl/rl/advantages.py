"""Advantages: GiGPO with opponent-grouped normalization, and a GRPO baseline.

References:
    GiGPO (arXiv 2505.10978): eq. 3 (episode level), eq. 6-7 (step level, anchor
    states), eq. 8 (combination).
    MAGE (arXiv 2603.03680): eq. 11-12, agent-specific (opponent-grouped) normalization;
    section 4 ablations (global vs local anchor).
    GRPO (DeepSeekMath, arXiv 2402.03300): group-normalized outcome reward.
    SPEC.md section 5.

Algorithm (``estimator="gigpo"``), for a batch of meta-episode records:

1. Targets. :func:`mage_rl.rl.returns.compute_sample_targets` gives every turn a step
   return ``G`` and an episode-level score ``S``.
2. Groups. Each record belongs to a group: its ``uid`` (one task instance, one
   opponent, G rollouts) under ``grouping="stationary"``; ``(env, seed, seat)`` under
   ``grouping="mixed"``, which lets one group span opponents (ablation).
3. Episode level. ``A_E = S - mean(S over the group)``, pooling every sample of the
   group (play and reflect turns, all episodes, all rollouts); ``mean_std_norm`` also
   divides by ``std + eps`` (unbiased std). A group of one has mean 0 and std 1.
4. Step level. Inside a group, samples with the same anchor key form an anchor group:
   ``A_S = G - mean(G over the anchor group)`` (same norm); an anchor group of one gets
   0. The key is the observation text plus the opponent id (``"reflection"`` plus the
   opponent id for reflect turns) plus the name of the node that made the call, so
   calls of different nodes never share a group (SPEC §4); ``anchor="local"`` adds the
   episode index.
5. ``A = A_E + omega * A_S``, one scalar per turn, spread over its response tokens.
   :func:`credit_parts` keeps the parts (``G``, ``S``, ``A_E``, ``A_S``, ``A``) of every
   call, for the run folder's logs; :func:`compute_advantages` returns ``A`` alone.

``estimator="grpo"`` ignores steps: each record's final-episode reward is normalized
within its group by mean and std, and every turn of the record gets that value.

Group and anchor ids are short sha1 hex digests of their parts, so they are stable across
processes and runs (never random ids).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from mage_rl.records import REFLECTION_ANCHOR, MetaEpisodeRecord, anchor_id, group_id
from mage_rl.rl.returns import ReturnConfig, compute_sample_targets
from mage_rl.sections import ESTIMATORS, NORMS, AdvantageConfig, Grouping, Norm

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# Pure array functions
# ---------------------------------------------------------------------------------------


def _group_indices(keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return groups


def group_normalize(
    values: npt.ArrayLike,
    keys: Sequence[Hashable],
    norm: Norm,
    eps: float,
    singleton: Literal["identity", "zero"],
) -> np.ndarray:
    """Subtract the group mean (and divide by ``std + eps``) within groups of equal key.

    Args:
        values: Per-sample values, shape ``(N,)``.
        keys: Group key per sample, length ``N``.
        norm: ``"mean_norm"`` or ``"mean_std_norm"`` (unbiased std).
        eps: Added to the std.
        singleton: A group of one gets mean 0 and std 1 (``"identity"``: the value is
            kept, divided by ``1 + eps`` under ``mean_std_norm``) or 0 (``"zero"``).

    Returns:
        Normalized values, shape ``(N,)``, float64. Each group is computed from its own
        members only, so the result does not depend on other groups or on sample order.
    """
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(keys) != len(x):
        raise ValueError(f"got {len(x)} values but {len(keys)} group keys")
    out = np.zeros_like(x)
    for idx in _group_indices(keys).values():
        v = x[idx]
        if len(idx) == 1:
            mean, std = 0.0, 1.0
            if singleton == "zero":
                continue
        else:
            mean, std = float(v.mean()), float(v.std(ddof=1))
        centred = v - mean
        out[idx] = centred / (std + eps) if norm == "mean_std_norm" else centred
    return out


def episode_level_advantages(
    scores: npt.ArrayLike,
    group_ids: Sequence[Hashable],
    norm: Norm = "mean_norm",
    eps: float = 1e-6,
) -> np.ndarray:
    """GiGPO episode-level advantage (GiGPO eq. 3; SPEC §5).

    ``A_E = S - mean(S over the group)``; ``mean_std_norm`` divides by ``std + eps``.
    A group of one has mean 0 and std 1.

    Args:
        scores: Episode-level score ``S`` per sample, shape ``(N,)``.
        group_ids: Group (uid) of each sample, length ``N``.
        norm: ``"mean_norm"`` or ``"mean_std_norm"``.
        eps: Added to the std.

    Returns:
        ``A_E``, shape ``(N,)``.
    """
    return group_normalize(scores, group_ids, norm, eps, singleton="identity")


def step_level_advantages(
    returns: npt.ArrayLike,
    group_ids: Sequence[Hashable],
    anchor_keys: Sequence[Hashable],
    norm: Norm = "mean_norm",
    eps: float = 1e-6,
) -> np.ndarray:
    """GiGPO step-level advantage over anchor-state groups (GiGPO eq. 6-7; SPEC §5).

    Samples of the same group with the same anchor key form an anchor group;
    ``A_S = G - mean(G over the anchor group)`` (``mean_std_norm`` divides by
    ``std + eps``). An anchor group of one gets 0.

    Args:
        returns: Step-wise return ``G`` per sample, shape ``(N,)``.
        group_ids: Group (uid) of each sample, length ``N``.
        anchor_keys: Anchor key per sample, length ``N`` (compared within a group only).
        norm: ``"mean_norm"`` or ``"mean_std_norm"``.
        eps: Added to the std.

    Returns:
        ``A_S``, shape ``(N,)``.
    """
    if len(group_ids) != len(anchor_keys):
        raise ValueError(f"got {len(group_ids)} group ids but {len(anchor_keys)} anchor keys")
    keys = list(zip(group_ids, anchor_keys, strict=True))
    return group_normalize(returns, keys, norm, eps, singleton="zero")


def gigpo_advantages(
    scores: npt.ArrayLike,
    returns: npt.ArrayLike,
    group_ids: Sequence[Hashable],
    anchor_keys: Sequence[Hashable],
    norm: Norm = "mean_norm",
    omega: float = 1.0,
    eps: float = 1e-6,
) -> np.ndarray:
    """GiGPO advantage ``A = A_E + omega * A_S`` (GiGPO eq. 8).

    Args:
        scores: Episode-level score ``S`` per sample, shape ``(N,)``.
        returns: Step-wise return ``G`` per sample, shape ``(N,)``.
        group_ids: Group (uid) of each sample, length ``N``.
        anchor_keys: Anchor key per sample, length ``N``.
        norm: ``"mean_norm"`` or ``"mean_std_norm"``.
        omega: Weight of the step-level part.
        eps: Added to the std.

    Returns:
        ``A``, shape ``(N,)``.
    """
    a_episode = episode_level_advantages(scores, group_ids, norm, eps)
    a_step = step_level_advantages(returns, group_ids, anchor_keys, norm, eps)
    return a_episode + omega * a_step


def grpo_advantages(
    final_rewards: npt.ArrayLike, group_ids: Sequence[Hashable], eps: float = 1e-6
) -> np.ndarray:
    """GRPO outcome advantage, one per meta-episode (DeepSeekMath eq. 3 outcome form).

    ``A = (R - mean(R over the group)) / (std + eps)`` with the unbiased std; a group of
    one has mean 0 and std 1.

    Args:
        final_rewards: Reward of the last episode played, per meta-episode, shape ``(M,)``.
        group_ids: Group of each meta-episode, length ``M``.
        eps: Added to the std.

    Returns:
        Advantage per meta-episode, shape ``(M,)``.
    """
    return group_normalize(final_rewards, group_ids, "mean_std_norm", eps, singleton="identity")


# ---------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------


def record_group(record: MetaEpisodeRecord, grouping: Grouping) -> str:
    """Group key of a record.

    Under ``stationary`` grouping this is the record's ``uid`` (or, when the producer left
    it empty, :func:`group_id` of its task and opponent). Under ``mixed`` grouping it is
    :func:`group_id` without the opponent, so rollouts of the same task and seat against
    different opponents share a group.
    """
    if grouping == "mixed":
        return group_id(record.env, record.seed, None, record.seat)
    return record.uid or group_id(record.env, record.seed, record.opponent, record.seat)


def record_anchor_ids(record: MetaEpisodeRecord, group: str, cfg: AdvantageConfig) -> list[str]:
    """Anchor id of every turn of a record, aligned with ``record.turns``."""
    ids = []
    for turn in record.turns:
        text = REFLECTION_ANCHOR if turn.kind == "reflect" else turn.anchor
        opponent = None if cfg.grouping == "mixed" else (turn.opponent or record.opponent)
        episode = turn.episode if cfg.anchor == "local" else None
        ids.append(anchor_id(group, text, opponent, episode, turn.node))
    return ids


def final_reward(record: MetaEpisodeRecord) -> float:
    """Reward of the last episode played (the quantity MAGE's objective targets).

    With the differential meta-reward, this is also the sum of the ``D_k``. A record
    without episode results falls back to the task rewards of its last episode's turns.
    """
    if record.episodes:
        return float(record.episodes[-1].reward)
    if not record.turns:
        return 0.0
    last = max(t.episode for t in record.turns)
    return float(sum(t.reward for t in record.turns if t.episode == last))


def _check_stationary(records: Sequence[MetaEpisodeRecord], groups: Sequence[str]) -> None:
    opponents: dict[str, set[str]] = {}
    for record, group in zip(records, groups, strict=True):
        opponents.setdefault(group, set()).add(record.opponent)
    for group, found in opponents.items():
        if len(found) > 1:
            raise ValueError(
                f"grouping='stationary' needs one opponent per uid group, but group {group!r} "
                f"holds opponents {sorted(found)}. Build uids with "
                "mage_rl.rl.advantages.group_id(env, seed, opponent, seat), or set "
                "grouping='mixed' to pool opponents on purpose."
            )


@dataclass(frozen=True)
class CallCredit:
    """The credit of one LLM call, part by part (SPEC §4-5).

    Attributes:
        reward: The task reward the environment emitted after the call (``Turn.reward``:
            non-zero only on the last acting call of an episode).
        ret: Step-wise return ``G`` (SPEC §4). GRPO: the record's final reward.
        score: Episode-level score ``S``, the call's own penalties subtracted. GRPO: the
            record's final reward.
        a_episode: Episode-level advantage ``A_E`` (GiGPO eq. 3). GRPO: the advantage.
        a_step: Step-level advantage ``A_S`` (GiGPO eq. 6-7). GRPO: 0.
        advantage: ``A = A_E + omega * A_S`` (GiGPO eq. 8), what the learner trains the
            call with.
    """

    reward: float
    ret: float
    score: float
    a_episode: float
    a_step: float
    advantage: float


def credit_parts(
    records: Sequence[MetaEpisodeRecord],
    ret_cfg: ReturnConfig | None = None,
    adv_cfg: AdvantageConfig | None = None,
) -> list[list[CallCredit]]:
    """The credit of every turn of every record: return, score and advantage parts.

    Args:
        records: Meta-episodes of one training batch (all G rollouts of each group must
            be present: baselines are computed over what is passed in).
        ret_cfg: Reward mode, discounts, penalties (defaults: MAGE).
        adv_cfg: Estimator, normalization, anchor scope, grouping (defaults: MAGE).

    Returns:
        ``credit[i][j]`` for turn ``j`` of ``records[i]``, aligned with
        ``records[i].turns``; ``credit[i][j].advantage`` is what
        :func:`compute_advantages` returns.

    Raises:
        ValueError: On malformed records, or a stationary group holding several opponents.
    """
    ret_cfg = ret_cfg or ReturnConfig()
    adv_cfg = adv_cfg or AdvantageConfig()
    groups = [record_group(r, adv_cfg.grouping) for r in records]
    if adv_cfg.grouping == "stationary":
        _check_stationary(records, groups)

    if adv_cfg.estimator in ESTIMATORS:
        return _registered(records, ret_cfg, adv_cfg)
    if adv_cfg.estimator == "grpo":
        finals = [final_reward(r) for r in records]
        per_record = grpo_advantages(finals, groups, adv_cfg.eps)
        return [
            [CallCredit(float(t.reward), final, final, float(a), 0.0, float(a)) for t in r.turns]
            for r, final, a in zip(records, finals, per_record, strict=True)
        ]

    scores: list[np.ndarray] = []
    returns: list[np.ndarray] = []
    sample_groups: list[str] = []
    anchors: list[str] = []
    for record, group in zip(records, groups, strict=True):
        g, s = compute_sample_targets(record, ret_cfg)
        returns.append(g)
        scores.append(s)
        sample_groups.extend([group] * len(record.turns))
        anchors.extend(record_anchor_ids(record, group, adv_cfg))
    if not sample_groups:
        return [[] for _ in records]
    unanchored = sum(1 for r in records for t in r.turns if t.kind == "play" and not t.anchor)
    if unanchored and adv_cfg.omega > 0:
        # Empty anchors all share one anchor group, which turns A_S into noise.
        logger.warning(
            "%d play turns have no anchor text; they share one GiGPO anchor group. "
            "Set Turn.anchor to the observation the turn acted on.",
            unanchored,
        )
    flat_g, flat_s = np.concatenate(returns), np.concatenate(scores)
    a_episode = episode_level_advantages(flat_s, sample_groups, adv_cfg.norm, adv_cfg.eps)
    a_step = step_level_advantages(flat_g, sample_groups, anchors, adv_cfg.norm, adv_cfg.eps)
    # The sum of gigpo_advantages, written out so that its parts are kept.
    advantage = a_episode + adv_cfg.omega * a_step
    out: list[list[CallCredit]] = []
    start = 0
    for record in records:
        out.append(
            [
                CallCredit(
                    float(t.reward),
                    float(flat_g[i]),
                    float(flat_s[i]),
                    float(a_episode[i]),
                    float(a_step[i]),
                    float(advantage[i]),
                )
                for i, t in enumerate(record.turns, start=start)
            ]
        )
        start += len(record.turns)
    return out


def compute_advantages(
    records: Sequence[MetaEpisodeRecord],
    ret_cfg: ReturnConfig | None = None,
    adv_cfg: AdvantageConfig | None = None,
    step_only: bool = False,
) -> list[list[float]]:
    """Advantage of every turn of every record (the ``advantage`` of :func:`credit_parts`).

    Args:
        records: Meta-episodes of one training batch (all G rollouts of each group must
            be present: baselines are computed over what is passed in).
        ret_cfg: Reward mode, discounts, penalties (defaults: MAGE).
        adv_cfg: Estimator, normalization, anchor scope, grouping (defaults: MAGE).
        step_only: Return GiGPO's step-level part ``A_S`` alone, without the
            episode-level part or ``omega``.

    Returns:
        ``advantages[i][j]`` for turn ``j`` of ``records[i]``, aligned with
        ``records[i].turns``.

    Raises:
        ValueError: On malformed records, or a stationary group holding several opponents.
    """
    if step_only and adv_cfg is not None and adv_cfg.estimator == "grpo":
        raise ValueError("step_only needs the gigpo estimator: GRPO has no step-level part")
    credit = credit_parts(records, ret_cfg, adv_cfg)
    if step_only:
        return [[c.a_step for c in calls] for calls in credit]
    return [[c.advantage for c in calls] for calls in credit]


def _registered(
    records: Sequence[MetaEpisodeRecord], ret_cfg: ReturnConfig, adv_cfg: AdvantageConfig
) -> list[list[CallCredit]]:
    """The credit a registered estimator gives: its per-turn advantages (floats, taken as
    the episode-level part) or its :class:`CallCredit` s, checked against the records.

    Raises:
        ValueError: It returned another number of records or of turns, or a non-finite
            advantage.
    """
    out = ESTIMATORS.get(adv_cfg.estimator)(records, ret_cfg, adv_cfg)
    name = adv_cfg.estimator
    if len(out) != len(records):
        raise ValueError(f"estimator {name!r} returned {len(out)} records for {len(records)}")
    credit = []
    for i, (record, values) in enumerate(zip(records, out, strict=True)):
        if len(values) != len(record.turns):
            raise ValueError(
                f"estimator {name!r} gave record {i} {len(values)} advantages for its "
                f"{len(record.turns)} turns; return one per turn, aligned with record.turns"
            )
        row = [
            v if isinstance(v, CallCredit)
            else CallCredit(float(t.reward), float("nan"), float("nan"), float(v), 0.0, float(v))
            for t, v in zip(record.turns, values, strict=True)
        ]  # fmt: skip
        if not all(np.isfinite(c.advantage) for c in row):
            raise ValueError(f"estimator {name!r} gave record {i} a non-finite advantage")
        credit.append(row)
    return credit
