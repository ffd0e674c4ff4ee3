"""MAGE turns as OpenRLHF ``Experience`` objects carrying MAGE advantages.

OpenRLHF's experience maker assumes one trajectory per prompt: it takes a scalar reward
per sample, groups samples by their *position* in the batch (``n_samples_per_prompt``
consecutive samples form a group) and turns the group-normalized reward into the
advantage of every token. A MAGE meta-episode is many LLM calls whose credit comes from
the step-wise returns and the opponent-grouped GiGPO baselines (SPEC §4-5), so both
steps are replaced:

1. :func:`experiences_from_records` computes the advantages with
   :func:`mage_rl.rl.advantages.compute_advantages` (returns, GiGPO, opponent grouping:
   the same functions the local learner uses) and builds one single-sample
   ``Experience`` per training sample of :func:`mage_rl.rl.batching.samples_from_records`:
   per turn, the advantage already spread over its response tokens, or, for a record in
   the conversation layout, one per meta-episode whose assistant segments carry their
   own advantages and sampling log-probs while the context between them is masked out.
2. :func:`keep_mage_advantages` takes the place of the experience maker's
   ``compute_advantages_and_returns``: after OpenRLHF has scored the samples with its
   actor and reference groups, it leaves the MAGE advantages untouched instead of
   recomputing them from rewards.

Token layout (OpenRLHF's): ``sequences`` is prompt + response, ``(1, T)``; the per-token
fields are ``(1, T - 1)`` and index ``i`` holds the token at position ``i + 1``, so the
response of a prompt of ``P`` tokens occupies indices ``P - 1 .. T - 2``. A conversation's
``sequences`` run up to its last segment, and a segment ``[s, e)`` occupies indices
``s - 1 .. e - 2``; ``action_mask`` is true exactly there. OpenRLHF's actor scores every
position and its token-mean losses read ``action_mask``, so the loss equals per-call
training on the same tokens, as in the local learner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mage_rl.cluster.deps import require
from mage_rl.records import MetaEpisodeRecord, Turn
from mage_rl.rl.advantages import AdvantageConfig, compute_advantages, final_reward
from mage_rl.rl.batching import ConversationSample, TrainingSample, record_samples
from mage_rl.rl.returns import ReturnConfig


def experience_class() -> Any:
    """OpenRLHF's ``Experience`` dataclass (imported on first use)."""
    return require("openrlhf.trainer.ppo_utils.experience", "MAGE experiences").Experience


def experiences_from_records(
    records: Sequence[MetaEpisodeRecord],
    ret_cfg: ReturnConfig | None = None,
    adv_cfg: AdvantageConfig | None = None,
    *,
    advantages: Sequence[Sequence[float]] | None = None,
) -> list[Any]:
    """One OpenRLHF ``Experience`` per training sample, with its MAGE advantages.

    Args:
        records: A training batch: every rollout of every group (baselines are
            computed over what is passed in).
        ret_cfg: Return settings (SPEC §3-4).
        adv_cfg: Advantage settings (SPEC §5).
        advantages: Per-turn advantages already computed with
            :func:`~mage_rl.rl.advantages.compute_advantages`; computed here if ``None``.

    Returns:
        Experiences in record order; within a record, the conversation's (if it carries
        one, see :mod:`mage_rl.rl.conversation`), then one per remaining turn in turn
        order. Each has ``sequences``,
        ``attention_mask``, ``action_mask`` (bool), ``rollout_log_probs`` (the sampling
        log-probs), ``advantages`` and ``returns`` (the advantage on every response
        token, as OpenRLHF's REINFORCE-style estimators store them), ``rewards`` (the
        meta-episode's final reward, which OpenRLHF logs), ``response_length``,
        ``truncated`` (a response hit its token limit), ``total_length``, ``prompts`` (the
        group uid), ``labels`` (``kind:episode:step``, joined by ``|`` over a
        conversation's calls) and ``info`` (``reward``, ``mage_advantage``: the token mean
        of the advantages).

    Raises:
        ValueError: If a turn has no token ids or log-probs (see
            :func:`~mage_rl.rl.batching.samples_from_records`).
    """
    experience = experience_class()
    if advantages is None:
        advantages = compute_advantages(records, ret_cfg, adv_cfg)
    if len(advantages) != len(records):
        raise ValueError(f"got {len(records)} records but {len(advantages)} advantage lists")
    out = []
    for record, advs in zip(records, advantages, strict=True):
        reward = torch.tensor([final_reward(record)], dtype=torch.float32)
        for sample, turn_indices in record_samples(record, advs):
            turns = [record.turns[j] for j in turn_indices]
            out.append(_experience(experience, sample, turns, record.uid, reward))
    return out


def _token_fields(sample: TrainingSample) -> tuple[list[int], list[tuple[int, int, float]]]:
    """The sequence and its trained spans ``(start, end, advantage)`` in sequence positions."""
    if isinstance(sample, ConversationSample):
        spans = [(seg.start, seg.end, float(seg.advantage)) for seg in sample.segments]
        return list(sample.ids[: sample.length]), spans
    p = len(sample.prompt_ids)
    spans = [(p, p + len(sample.response_ids), float(sample.advantage))]
    return [*sample.prompt_ids, *sample.response_ids], spans


def _experience(
    experience: Any, sample: TrainingSample, turns: list[Turn], uid: str, reward: torch.Tensor
) -> Any:
    sequence, spans = _token_fields(sample)
    total = len(sequence)
    old = (
        [x for seg in sample.segments for x in seg.old_logprobs]
        if isinstance(sample, ConversationSample)
        else list(sample.old_logprobs)
    )
    action_mask = torch.zeros(total - 1, dtype=torch.bool)
    adv = torch.zeros(total - 1, dtype=torch.float32)
    for start, end, value in spans:
        # Index i of the per-token fields holds the token at position i + 1.
        action_mask[start - 1 : end - 1] = True
        adv[start - 1 : end - 1] = value
    rollout_logp = torch.zeros(total - 1, dtype=torch.float32)
    rollout_logp[action_mask] = torch.tensor(old, dtype=torch.float32)
    n_actions = int(action_mask.sum())
    return experience(
        sequences=torch.tensor(sequence, dtype=torch.long).unsqueeze(0),
        attention_mask=torch.ones(1, total, dtype=torch.long),
        action_mask=action_mask.unsqueeze(0),
        rollout_log_probs=rollout_logp.unsqueeze(0),
        advantages=adv.unsqueeze(0),
        returns=adv.clone().unsqueeze(0),
        rewards=reward.clone(),
        response_length=torch.tensor([float(n_actions)]),
        truncated=torch.tensor([any(t.finish_reason == "length" for t in turns)]),
        total_length=torch.tensor([float(total)]),
        prompts=[uid],
        labels=["|".join(f"{t.kind}:{t.episode}:{t.step}" for t in turns)],
        info={
            "reward": reward.clone(),
            "mage_advantage": torch.tensor([float(adv.sum()) / max(n_actions, 1)]),
        },
    )


def keep_mage_advantages(experiences: Sequence[Any]) -> list[Any]:
    """The experience maker's advantage step for MAGE experiences.

    OpenRLHF's version would overwrite ``advantages`` from ``rewards`` with a positional
    group baseline; here the advantages made by :func:`experiences_from_records` stay,
    masked to the (possibly re-padded) action tokens. The KL to the reference is a loss
    term (``--algo.kl.use_loss``, as SPEC §6 asks), not a reward penalty, so no reward
    shaping happens either.

    Raises:
        ValueError: If an experience carries no advantages (it was not built by
            :func:`experiences_from_records`).
    """
    for exp in experiences:
        if exp.advantages is None:
            raise ValueError(
                "an experience has no advantages; build MAGE experiences with "
                "mage_rl.cluster.experience.experiences_from_records"
            )
        mask = exp.action_mask.to(exp.advantages.dtype)
        exp.advantages = exp.advantages * mask
        exp.returns = exp.advantages.clone()
        exp.kl = None
        exp.info["return"] = (exp.advantages.sum(-1) / mask.sum(-1).clamp(min=1)).float()
    return list(experiences)
