"""The exploration mixture of constrained decoding: what is sampled and what is recorded."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from mage_rl.config import PolicyConfig
from mage_rl.policy.base import SamplingParams
from mage_rl.policy.constrained import explored_logprobs, mixture_logprobs, restricted_logprobs
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny
from mage_rl.rl.batching import Sample, behaviour_logprobs
from mage_rl.rl.learner import Learner, LearnerConfig

CHOICES = ("<action>ROCK</action>", "<action>PAPER</action>", "<action>SCISSORS</action>")
CHAT = [{"role": "user", "content": "Choose your move."}]


def test_mixture_logprobs_are_a_distribution_with_a_floor() -> None:
    logits = torch.tensor([5.0, -20.0, 0.0, 3.0])
    allowed = [0, 1, 3]
    plain = restricted_logprobs(logits, 1.0, allowed)
    mixed = explored_logprobs(plain, allowed, 0.3)
    probs = mixed.exp()
    assert float(probs[allowed].sum()) == pytest.approx(1.0, abs=1e-6)
    assert float(probs[2]) == 0.0  # outside the allowed set stays impossible
    # Every allowed token keeps at least explore / n of the mass.
    assert float(probs[1]) == pytest.approx(0.3 / 3 + 0.7 * float(plain[1].exp()), rel=1e-5)
    assert float(mixture_logprobs(plain[0], 3, 0.3)) == pytest.approx(float(mixed[0]), abs=1e-6)
    # No mixture where nothing is chosen, or with explore 0.
    assert float(mixture_logprobs(torch.tensor(0.0), 1, 0.3)) == 0.0
    assert torch.equal(explored_logprobs(plain, allowed, 0.0), plain)


def test_explore_is_validated() -> None:
    with pytest.raises(ValueError, match="explore"):
        SamplingParams(explore=1.0)
    with pytest.raises(ValueError, match="constrain_actions"):
        PolicyConfig(model="tiny", explore=0.1)
    assert PolicyConfig(model="tiny", explore=0.1, constrain_actions=True).explore == 0.1


def test_engine_records_the_mixture_and_the_learner_recovers_it() -> None:
    model, tokenizer = build_tiny(seed=3, init_std=0.05)
    explore = 0.5

    async def draw(params):
        return await asyncio.gather(*(engine.generate(CHAT, p) for p in params))

    with LocalEngine(model, tokenizer, seed=0) as engine:
        plain = asyncio.run(draw([SamplingParams(choices=CHOICES, seed=i) for i in range(40)]))
        mixed = asyncio.run(
            draw([SamplingParams(choices=CHOICES, seed=i, explore=explore) for i in range(40)])
        )
    learner = Learner(model, LearnerConfig(kl_coef=0.0, dtype="fp32"))
    samples = [Sample(g.prompt_ids, g.response_ids, g.logprobs, 1.0, g.allowed) for g in mixed]
    policy = learner.compute_logprobs(samples)
    for gen, sample, lps in zip(mixed, samples, policy, strict=True):
        recorded = behaviour_logprobs(sample, lps, explore)
        assert recorded == pytest.approx(gen.logprobs, abs=1e-4)
        branch = [j for j, a in enumerate(gen.allowed) if len(a) > 1]
        assert branch, "three choices must branch somewhere"
        for j in branch:
            # The mixture gives each choice at least explore / n.
            assert math.exp(gen.logprobs[j]) >= explore / len(gen.allowed[j]) - 1e-6
            assert gen.logprobs[j] != pytest.approx(lps[j], abs=1e-6)
    # Without explore the recorded log-probs are the policy's own.
    samples = [Sample(g.prompt_ids, g.response_ids, g.logprobs, 1.0, g.allowed) for g in plain]
    for gen, lps in zip(plain, learner.compute_logprobs(samples), strict=True):
        assert lps == pytest.approx(gen.logprobs, abs=1e-4)


def test_the_trainer_divides_by_the_mixture_it_sampled_from(tmp_path) -> None:
    from mage_rl.config import TrainConfig, load_config
    from mage_rl.rl.trainer import Trainer

    base = [
        "env.name=rps", "env.population=rps_train", "env.seat=first", "policy.model=tiny",
        "policy.dtype=fp32", "learner.dtype=fp32", "policy.constrain_actions=true",
        "policy.max_tokens=12", "policy.explore=0.2", "rollout.tasks=3", "rollout.group_size=2",
        "eval.tasks=0", "eval.before=false",
    ]  # fmt: skip
    exact = Trainer(load_config(None, base, TrainConfig), tmp_path / "exact", progress=False)
    # fp32 sampling records exact mixture log-probs: nothing to recompute.
    assert exact.recompute_old_logprobs is False
    records = exact.rollout(0)
    stats = exact.learn(records)
    # The ratio is pi / mixture, not 1, before any step: old and new log-probs differ.
    assert abs(stats["approx_kl"]) > 1e-6
    exact.engine.close()
