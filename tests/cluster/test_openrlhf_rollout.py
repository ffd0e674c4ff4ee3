"""The cluster rollout path on a CPU, with OpenRLHF's own modules where they import here.

Meta-episode graphs are driven through :class:`VLLMEnginePolicy` by stand-in engines that
follow vLLM's token-level generate contract but run the local engine; their turns become
OpenRLHF ``Experience`` objects carrying MAGE advantages; OpenRLHF's ``Actor`` scores them
and its ``PolicyLoss`` and KL agree with MAGE's own loss functions.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from mage_rl.cluster.experience import experiences_from_records, keep_mage_advantages
from mage_rl.cluster.standin import sampling_params_namespace
from mage_rl.cluster.vllm_policy import VLLMEnginePolicy, to_vllm_kwargs
from mage_rl.policy.base import SamplingParams
from mage_rl.policy.models import load_model
from mage_rl.rl.advantages import compute_advantages
from mage_rl.rl.batching import samples_from_records
from mage_rl.rl.learner import Learner, LearnerConfig
from mage_rl.rl.loss import kl_penalty, policy_loss

pytest.importorskip("openrlhf", reason="the dev set-up installs openrlhf (scripts/setup.sh dev)")
from openrlhf.models import Actor, PolicyLoss  # noqa: E402
from openrlhf.models.utils import compute_approx_kl  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402


@pytest.fixture(scope="module")
def rollout(standin_rollout):
    cfg, model, tokenizer, standins, records = standin_rollout
    return cfg, model, tokenizer, None, standins, records


def test_graphs_run_on_the_standin_engines(rollout) -> None:
    cfg, model, _tok, _p, standins, records = rollout
    assert len(records) == 8
    turns = [t for r in records for t in r.turns]
    assert sum(s.requests for s in standins) == len(turns)  # one request per LLM call
    assert all(s.requests > 0 for s in standins)  # spread over both engines
    assert {t.kind for t in turns} >= {"play"}
    # Every turn carries ids and the sampling log-probs, and those are the model's own:
    # the learner's fresh fp32 pass reproduces them.
    samples = samples_from_records(records, compute_advantages(records))[:16]
    learner = Learner(model, LearnerConfig(kl_coef=0.0, dtype="fp32"))
    fresh = learner.compute_logprobs(samples)
    for s, lp in zip(samples, fresh, strict=True):
        assert torch.allclose(torch.tensor(list(s.old_logprobs)), torch.as_tensor(lp), atol=1e-4)


def test_vllm_request_follows_the_contract() -> None:
    kwargs = to_vllm_kwargs(SamplingParams(temperature=0.7, top_k=0, stop=("</action>",)), 32)
    assert kwargs["top_k"] == -1 and kwargs["logprobs"] == 1
    assert kwargs["include_stop_str_in_output"] and kwargs["stop"] == ["</action>"]
    with pytest.raises(ValueError, match="constrain_actions"):
        to_vllm_kwargs(SamplingParams(choices=("PASS", "BET")), 8)


def test_prompt_too_long_for_the_engines_is_refused(rollout) -> None:
    _cfg, _m, tokenizer, _p, standins, _r = rollout
    small = VLLMEnginePolicy(
        standins, tokenizer, max_model_len=4, sampling_params_factory=sampling_params_namespace
    )
    with pytest.raises(ValueError, match="max_len"):
        asyncio.run(small.generate([{"role": "user", "content": "a long prompt " * 5}]))


def test_experiences_carry_mage_advantages(rollout) -> None:
    cfg, _m, _t, _p, _s, records = rollout
    advantages = compute_advantages(records, cfg.returns, cfg.advantages)
    exps = experiences_from_records(records, cfg.returns, cfg.advantages)
    turns = [t for r in records for t in r.turns]
    flat = [a for per in advantages for a in per]
    assert len(exps) == len(turns) == len(flat)
    assert all(isinstance(e, Experience) for e in exps)
    for exp, turn, adv in zip(exps, turns, flat, strict=True):
        p, n = len(turn.prompt_ids), len(turn.response_ids)
        assert exp.sequences.shape == (1, p + n)
        assert exp.action_mask.shape == (1, p + n - 1)
        assert int(exp.action_mask.sum()) == n
        # Index i of the per-token fields is the token at position i + 1.
        picked = exp.sequences[0, 1:][exp.action_mask[0]]
        assert picked.tolist() == list(turn.response_ids)
        assert torch.allclose(
            exp.rollout_log_probs[0][exp.action_mask[0]], torch.tensor(turn.logprobs)
        )
        assert torch.allclose(exp.advantages[0][exp.action_mask[0]], torch.full((n,), adv))
        assert float(exp.advantages[0][~exp.action_mask[0]].abs().sum()) == 0.0
    # Opponent-grouped GiGPO: mean_norm centres every uid group (play and reflect pooled
    # in A_E, anchors in A_S), so the advantages are not all equal.
    assert len({round(a, 6) for a in flat}) > 1


def test_openrlhf_actor_loss_and_kl_agree_with_mage(rollout) -> None:
    cfg, model, tokenizer, _p, _s, records = rollout
    exps = experiences_from_records(records, cfg.returns, cfg.advantages)[:12]
    # OpenRLHF's batching (right padding) and its experience maker's advantage step.
    batch = Experience.concat_experiences(exps, tokenizer.pad_token_id)
    (batch,) = keep_mage_advantages([batch])
    actor = Actor(model, temperature=1.0)
    actor.packing_samples = False  # set only by Actor's from-pretrained branch
    actor.eval()
    logp = actor(batch.sequences, batch.action_mask, attention_mask=batch.attention_mask)
    mask = batch.action_mask.float()
    # OpenRLHF's actor reproduces the sampling log-probs the stand-in engine returned.
    assert torch.allclose(logp * mask, batch.rollout_log_probs * mask, atol=1e-4)

    # A perturbed "old" policy so that clipping is active on some tokens.
    gen = torch.Generator().manual_seed(0)
    old = batch.rollout_log_probs + 0.3 * torch.randn(logp.shape, generator=gen)
    ours, stats = policy_loss(logp, old, batch.advantages, mask, clip_eps=0.2)
    theirs, clip_ratio, ppo_kl, _vk, _fr = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)(
        logp, old, batch.advantages, action_mask=batch.action_mask
    )
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert 0 < float(clip_ratio) < 1
    assert torch.allclose(stats["approx_kl"], ppo_kl, atol=1e-6)
    # k3 ("low_var_kl") to a reference: same per-token values on the response tokens.
    ref = old.detach()
    kl_theirs = compute_approx_kl(logp, ref, kl_estimator="k3")
    assert torch.allclose(kl_penalty(logp, ref, "low_var_kl") * mask, kl_theirs * mask, atol=1e-5)


def test_openrlhf_loss_trains_the_actor_on_mage_experiences(rollout) -> None:
    cfg, _model, tokenizer, _p, _s, records = rollout
    model, _ = load_model("tiny", dtype="fp32")
    exps = experiences_from_records(records, cfg.returns, cfg.advantages)[:8]
    (batch,) = keep_mage_advantages([Experience.concat_experiences(exps, tokenizer.pad_token_id)])
    actor = Actor(model, temperature=1.0)
    actor.packing_samples = False
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optim = torch.optim.SGD(actor.parameters(), lr=1e-2)
    logp = actor(batch.sequences, batch.action_mask, attention_mask=batch.attention_mask)
    loss, *_ = PolicyLoss()(logp, batch.rollout_log_probs, batch.advantages, batch.action_mask)
    loss.backward()
    optim.step()
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def _conversation_record(model, tokenizer):
    """A meta-episode of five calls in the conversation layout, with the model's log-probs."""
    from mage_rl.policy.conversation import ConversationTemplate
    from mage_rl.records import MetaEpisodeRecord, Turn
    from mage_rl.rl.batching import Sample
    from mage_rl.rl.conversation import ConversationTrace

    template = ConversationTemplate(tokenizer)
    conv = template.start(
        [{"role": "system", "content": "Kuhn Poker."}, {"role": "user", "content": "Card: King."}]
    )
    g = torch.Generator().manual_seed(0)
    for call in range(5):
        ids = torch.randint(10, 300, (3 + 2 * call,), generator=g).tolist()
        conv = template.append_response(conv, ids, tokenizer.decode(ids))
        content = f"Step {call}: the opponent played BET."
        conv = template.append_messages(conv, [{"role": "user", "content": content}])
    spans = list(conv.segments)
    calls = [Sample(conv.ids[:s], conv.ids[s:e], [0.0] * (e - s), 0.0) for s, e in spans]
    logprobs = Learner(model, LearnerConfig(dtype="fp32")).compute_logprobs(calls)
    turns = [
        Turn(kind="play", episode=0, step=k, prompt_ids=list(c.prompt_ids),
             response_ids=list(c.response_ids), logprobs=lp)
        for k, (c, lp) in enumerate(zip(calls, logprobs, strict=True))
    ]  # fmt: skip
    record = MetaEpisodeRecord(
        uid="u", rollout=0, env="kuhn_poker", seed=0, opponent="o", seat=0, turns=turns
    )
    trace = ConversationTrace(
        ids=list(conv.ids), segments=[(s, e, k) for k, (s, e) in enumerate(spans)]
    )
    return record, trace


def test_conversation_experience_trains_like_its_calls(rollout) -> None:
    _cfg, model, tokenizer, _p, _s, _r = rollout
    record, trace = _conversation_record(model, tokenizer)
    advantages = [[1.5, -0.5, 2.0, -1.0, 0.25]]
    per_call = experiences_from_records([record], advantages=advantages)
    record.conversation = trace
    (conv,) = experiences_from_records([record], advantages=advantages)
    turns = record.turns
    # The action mask selects exactly the segments' tokens, with their own advantages and
    # sampling log-probs; the context between segments is masked out.
    mask = conv.action_mask[0]
    assert conv.sequences.shape == (1, trace.segments[-1][1])
    assert conv.sequences[0, 1:][mask].tolist() == [t for turn in turns for t in turn.response_ids]
    expected_adv = [
        a for turn, a in zip(turns, advantages[0], strict=True) for _ in turn.response_ids
    ]
    assert conv.advantages[0][mask].tolist() == pytest.approx(expected_adv)
    old = [x for turn in turns for x in turn.logprobs]
    assert conv.rollout_log_probs[0][mask].tolist() == pytest.approx(old)
    assert float(conv.advantages[0][~mask].abs().sum()) == 0.0
    assert conv.labels == ["|".join(f"play:0:{k}" for k in range(5))]

    # OpenRLHF's actor and token-mean PolicyLoss give the same log-probs and loss on the
    # conversation as on its calls, batched the OpenRLHF way.
    (conv,) = keep_mage_advantages([conv])
    (calls,) = keep_mage_advantages(
        [Experience.concat_experiences(per_call, tokenizer.pad_token_id)]
    )
    actor = Actor(model, temperature=1.0)
    actor.packing_samples = False
    actor.eval()
    logp_conv = actor(conv.sequences, conv.action_mask, attention_mask=conv.attention_mask)
    logp_calls = actor(calls.sequences, calls.action_mask, attention_mask=calls.attention_mask)
    torch.testing.assert_close(
        logp_conv[conv.action_mask], logp_calls[calls.action_mask], atol=1e-5, rtol=1e-5
    )
    assert torch.allclose(logp_conv[conv.action_mask], torch.tensor(old), atol=1e-4)
    gen = torch.Generator().manual_seed(1)
    noise = 0.3 * torch.randn(len(old), generator=gen)
    losses = []
    for exp, logp in ((conv, logp_conv), (calls, logp_calls)):
        shifted = exp.rollout_log_probs.clone()
        shifted[exp.action_mask] += noise
        loss, clip_ratio, *_ = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2)(
            logp, shifted, exp.advantages, action_mask=exp.action_mask
        )
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
