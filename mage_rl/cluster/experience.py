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
   ``Experience`` per turn, the advantage already spread over its response tokens.
2. :func:`keep_mage_advantages` takes the place of the experience maker's
   ``compute_advantages_and_returns``: after OpenRLHF has scored the samples with its
   actor and reference groups, it leaves the MAGE advantages untouched instead of
   recomputing them from rewards.

Token layout (OpenRLHF's): ``sequences`` is prompt + response, ``(1, T)``; the per-token
fields are ``(1, T - 1)`` and index ``i`` holds the token at position ``i + 1``, so the
response of a prompt of ``P`` tokens occupies indices ``P - 1 .. T - 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mage_rl.records import MetaEpisodeRecord
from mage_rl.rl.advantages import AdvantageConfig, compute_advantages, final_reward
from mage_rl.rl.batching import samples_from_records
from mage_rl.rl.returns import ReturnConfig


def experience_class() -> Any:
    """OpenRLHF's ``Experience`` dataclass (imported on first use)."""
    from mage_rl.cluster.deps import require

    return require("openrlhf.trainer.ppo_utils.experience", "MAGE experiences").Experience


def experiences_from_records(
    records: Sequence[MetaEpisodeRecord],
    ret_cfg: ReturnConfig | None = None,
    adv_cfg: AdvantageConfig | None = None,
    *,
    advantages: Sequence[Sequence[float]] | None = None,
) -> list[Any]:
    """One OpenRLHF ``Experience`` per turn, with its MAGE advantage.

    Args:
        records: A training batch: every rollout of every group (baselines are
            computed over what is passed in).
        ret_cfg: Return settings (SPEC §3-4).
        adv_cfg: Advantage settings (SPEC §5).
        advantages: Per-turn advantages already computed with
            :func:`~mage_rl.rl.advantages.compute_advantages`; computed here if ``None``.

    Returns:
        Experiences in record and turn order. Each has ``sequences``,
        ``attention_mask``, ``action_mask`` (bool), ``rollout_log_probs`` (the sampling
        log-probs), ``advantages`` and ``returns`` (the advantage on every response
        token, as OpenRLHF's REINFORCE-style estimators store them), ``rewards`` (the
        meta-episode's final reward, which OpenRLHF logs), ``response_length``,
        ``truncated``, ``total_length``, ``prompts`` (the group uid), ``labels``
        (``kind:episode:step``) and ``info`` (``reward``, ``mage_advantage``).

    Raises:
        ValueError: If a turn has no token ids or log-probs (see
            :func:`~mage_rl.rl.batching.samples_from_records`).
    """
    experience = experience_class()
    if advantages is None:
        advantages = compute_advantages(records, ret_cfg, adv_cfg)
    samples = samples_from_records(records, advantages)
    out = []
    flat_turns = [(r, t) for r in records for t in r.turns if t.trained]
    for sample, (record, turn) in zip(samples, flat_turns, strict=True):
        prompt_len, resp_len = len(sample.prompt_ids), len(sample.response_ids)
        total = prompt_len + resp_len
        sequences = torch.tensor([*sample.prompt_ids, *sample.response_ids], dtype=torch.long)
        action_mask = torch.zeros(total - 1, dtype=torch.bool)
        action_mask[prompt_len - 1 :] = True
        rollout_logp = torch.zeros(total - 1, dtype=torch.float32)
        rollout_logp[prompt_len - 1 :] = torch.tensor(list(sample.old_logprobs))
        adv = action_mask.float() * float(sample.advantage)
        reward = torch.tensor([final_reward(record)], dtype=torch.float32)
        out.append(
            experience(
                sequences=sequences.unsqueeze(0),
                attention_mask=torch.ones(1, total, dtype=torch.long),
                action_mask=action_mask.unsqueeze(0),
                rollout_log_probs=rollout_logp.unsqueeze(0),
                advantages=adv.unsqueeze(0),
                returns=adv.clone().unsqueeze(0),
                rewards=reward,
                response_length=torch.tensor([float(resp_len)]),
                truncated=torch.tensor([turn.finish_reason == "length"]),
                total_length=torch.tensor([float(total)]),
                prompts=[record.uid],
                labels=[f"{turn.kind}:{turn.episode}:{turn.step}"],
                info={
                    "reward": reward.clone(),
                    "mage_advantage": torch.tensor([float(sample.advantage)]),
                },
            )
        )
    return out


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
