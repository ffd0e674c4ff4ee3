"""The embedded learner on a tiny Qwen3 model built in-process (no downloads, no tokenizer)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from mage_rl.policy.models import cpu_supports_bf16
from mage_rl.rl.batching import Sample
from mage_rl.rl.learner import Learner, LearnerConfig
from mage_rl.rl.model_setup import resolve_autocast_dtype
from mage_rl.rl.packing import pack_micro_batches

VOCAB = 128


def make_model(seed: int = 0) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def random_pairs(n: int = 10, seed: int = 1) -> list[tuple[list[int], list[int]]]:
    """Random (prompt, response) token sequences of varied lengths."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        p = int(torch.randint(2, 16, (1,), generator=g))
        r = int(torch.randint(1, 9, (1,), generator=g))
        pairs.append(
            (
                torch.randint(0, VOCAB, (p,), generator=g).tolist(),
                torch.randint(0, VOCAB, (r,), generator=g).tolist(),
            )
        )
    return pairs


def on_policy_samples(learner: Learner, advantages: list[float], seed: int = 1) -> list[Sample]:
    pairs = random_pairs(len(advantages), seed)
    old = learner.compute_logprobs([(p, r, [0.0] * len(r), 0.0) for p, r in pairs])
    return [Sample(p, r, lp, a) for (p, r), lp, a in zip(pairs, old, advantages, strict=True)]


def manual_logprobs(
    model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float = 1.0
) -> list[float]:
    """Unpadded single-sequence reference: logits at position len(prompt) - 1 + j predict token j."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(response)]


def fp32(**kwargs: object) -> LearnerConfig:
    return LearnerConfig(dtype="fp32", **kwargs)  # type: ignore[arg-type]


def test_logprobs_align_with_unpadded_forward() -> None:
    learner = Learner(make_model(), fp32(micro_batch_tokens=64))
    pairs = random_pairs(8)
    for temperature in (1.0, 0.7):
        got = learner.compute_logprobs([(p, r, [0.0] * len(r), 0.0) for p, r in pairs], temperature)
        for (p, r), lp in zip(pairs, got, strict=True):
            torch.testing.assert_close(
                torch.tensor(lp),
                torch.tensor(manual_logprobs(learner.model, p, r, temperature)),
                atol=1e-5,
                rtol=1e-5,
            )


def test_on_policy_update_starts_at_ratio_one() -> None:
    learner = Learner(make_model(), fp32(lr=1e-3, mini_batch_size=64, entropy_coef=0.0))
    samples = on_policy_samples(learner, [1.0, -1.0, 0.5, 2.0, -0.5, 1.0])
    stats = learner.update(samples)
    # One mini-batch, ratio 1: pg_loss = -(token-weighted mean advantage), nothing clipped.
    tokens = sum(len(s.response_ids) for s in samples)
    expected = -sum(s.advantage * len(s.response_ids) for s in samples) / tokens
    assert stats["pg_loss"] == pytest.approx(expected, abs=1e-5)
    assert stats["clip_frac"] == 0.0
    assert abs(stats["approx_kl"]) < 1e-6
    assert stats["tokens"] == tokens and stats["steps"] == 1
    assert all(math.isfinite(v) for v in stats.values())


def test_update_changes_parameters() -> None:
    learner = Learner(make_model(), fp32(lr=1e-3, mini_batch_size=4))
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    stats = learner.update(on_policy_samples(learner, [1.0, -1.0] * 5))
    assert stats["steps"] == 3  # ceil(10 / 4) optimizer steps
    changed = [n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)
    assert learner.step == 3


def test_repeated_updates_raise_logprob_of_positive_samples() -> None:
    learner = Learner(make_model(), fp32(lr=1e-2, entropy_coef=0.0))
    positive = on_policy_samples(learner, [1.0] * 6, seed=3)
    negative = on_policy_samples(learner, [-1.0] * 6, seed=4)
    samples = positive + negative

    def mean_logprob(group: list[Sample]) -> float:
        values = learner.compute_logprobs(group)
        return sum(map(sum, values)) / sum(map(len, values))

    pos0, neg0 = mean_logprob(positive), mean_logprob(negative)
    losses = [learner.update(samples)["pg_loss"] for _ in range(5)]
    assert mean_logprob(positive) > pos0 + 0.1
    assert mean_logprob(negative) < neg0 - 0.1
    assert losses[-1] < losses[0]


@pytest.mark.parametrize(("mini_batch_size", "epochs"), [(64, 1), (3, 1), (4, 2)])
@pytest.mark.parametrize("explore", [0.0, 0.3])
def test_rescoring_inside_the_update_equals_rescoring_first(
    mini_batch_size: int, epochs: int, explore: float
) -> None:
    """Rescoring inside the update gives the weights of rescoring before it."""
    from mage_rl.rl.batching import behaviour_logprobs

    # Adam's first steps are about lr x sign(gradient): where a gradient is near zero, a
    # last-bit difference between two summation orders (another torch build, other
    # thread counts) flips the step. A large epsilon keeps the step linear in the
    # gradient there, so the comparison measures the two paths, not the rounding.
    config = fp32(lr=1e-3, mini_batch_size=mini_batch_size, ppo_epochs=epochs,
                  entropy_coef=0.01, adam_eps=1e-3)  # fmt: skip
    model = make_model()
    fused = Learner(copy.deepcopy(model), config)
    first = Learner(copy.deepcopy(model), config)
    g = torch.Generator().manual_seed(5)
    samples = []
    for p, r in random_pairs(8, seed=2):
        # Two to four allowed ids at every position, so the mixture changes them.
        allowed = [
            sorted({t, *torch.randint(0, VOCAB, (int(torch.randint(1, 4, (1,), generator=g)),),
                                      generator=g).tolist()})
            for t in r
        ]  # fmt: skip
        samples.append(Sample(p, r, [-9.0] * len(r), float(torch.randn(1, generator=g)), allowed))
    fused_stats = fused.update(samples, old_logprobs="rescored", explore=explore)
    rescored = [
        s.with_old_logprobs(behaviour_logprobs(s, lp, explore))
        for s, lp in zip(samples, first.compute_logprobs(samples), strict=True)
    ]
    first_stats = first.update(rescored)
    for name in ("loss", "pg_loss", "approx_kl", "clip_frac"):
        assert fused_stats[name] == pytest.approx(first_stats[name], rel=1e-4, abs=1e-6), name
    for (name, a), b in zip(first.model.named_parameters(), fused.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    if explore == 0.0 and mini_batch_size == 64:
        assert abs(fused_stats["approx_kl"]) < 1e-7  # one step from the rescoring weights


def test_the_mixture_is_per_token_and_leaves_forced_tokens_alone() -> None:
    from mage_rl.policy.constrained import allowed_index, mixture_logprobs

    allowed = [[[1, 2, 3], [4], []], [[5, 6], [7, 8, 9, 10], [11]]]
    index = allowed_index(allowed, 3)
    logp = torch.tensor([[-0.5, 0.0, -2.0], [-1.5, -0.1, 0.0]])
    got = mixture_logprobs(logp, (index >= 0).sum(-1), 0.25)
    for b, row in enumerate(allowed):
        for j, ids in enumerate(row):
            # Written out in probability space, in double precision.
            p = math.exp(float(logp[b, j]))
            want = math.log(0.75 * p + 0.25 / len(ids)) if len(ids) >= 2 else float(logp[b, j])
            assert float(got[b, j]) == pytest.approx(want, abs=1e-6)
    assert torch.equal(mixture_logprobs(logp, (index >= 0).sum(-1), 0.0), logp)


def test_micro_batches_give_the_same_gradient() -> None:
    model = make_model()
    config = dict(lr=1e-3, entropy_coef=0.01, kl_coef=0.1)
    whole = Learner(copy.deepcopy(model), fp32(micro_batch_tokens=10_000, **config))
    split = Learner(copy.deepcopy(model), fp32(micro_batch_tokens=24, **config))
    samples = on_policy_samples(whole, [1.0, -2.0, 0.5, 3.0, -1.0, 0.25, 1.5, -0.5])
    # Perturb old log-probs so some ratios are clipped.
    samples = [
        Sample(
            s.prompt_ids,
            s.response_ids,
            [x + 0.3 * (-1) ** i for i, x in enumerate(s.old_logprobs)],
            s.advantage,
        )
        for s in samples
    ]
    assert len(pack_micro_batches([s.length for s in samples], 24)) > 3
    stats_whole = whole.accumulate_gradients(samples)
    stats_split = split.accumulate_gradients(samples)
    for name in ("loss", "pg_loss", "entropy", "clip_frac"):
        assert stats_split[name] == pytest.approx(stats_whole[name], rel=1e-5, abs=1e-7)
    for (name, a), b in zip(whole.model.named_parameters(), split.model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_lora_trains_only_adapters_and_merges() -> None:
    learner = Learner(make_model(), fp32(lr=1e-2, lora=True, lora_r=4, lora_alpha=8, kl_coef=0.1))
    assert learner.ref_model is None  # the reference is the base with adapters disabled
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    samples = on_policy_samples(learner, [1.0, -1.0] * 4)
    for _ in range(2):
        stats = learner.update(samples)
    assert stats["kl"] > 0
    changed = {n for n, p in learner.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)

    # Merged weights reproduce the adapted model in a plain model of the same architecture.
    merged = learner.state_dict_for_inference()
    plain = make_model(seed=99)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.tensor([samples[0].prompt_ids + samples[0].response_ids])
    with torch.no_grad():
        torch.testing.assert_close(
            plain(input_ids=ids).logits, learner.model(input_ids=ids).logits, atol=1e-5, rtol=1e-5
        )


def test_kl_reference_is_a_frozen_copy() -> None:
    learner = Learner(make_model(), fp32(lr=1e-2, kl_coef=0.1))
    assert learner.ref_model is not None and learner.ref_model is not learner.model
    assert not any(p.requires_grad for p in learner.ref_model.parameters())
    samples = on_policy_samples(learner, [1.0, -1.0] * 4)
    first = learner.update(samples)
    second = learner.update(samples)
    assert abs(first["kl"]) < 1e-6  # one mini-batch, policy still equal to the reference
    assert second["kl"] > 0
    sd = learner.state_dict_for_inference()
    assert set(sd) == set(learner.model.state_dict())


def test_the_entropy_bonus_alone_raises_the_entropy() -> None:
    # No advantage opposes it: a large bonus makes the policy flatter update by update.
    learner = Learner(make_model(), fp32(lr=1e-2, entropy_coef=2.0))
    samples = on_policy_samples(learner, [0.0] * 6)
    stats = [learner.update(samples) for _ in range(4)]
    assert stats[-1]["entropy"] > stats[0]["entropy"]


def test_learning_rate_warms_up_linearly_and_resumes_on_schedule(tmp_path: Path) -> None:
    def record_lrs(learner: Learner) -> list[float]:
        seen: list[float] = []
        step = learner.optimizer.step

        def spy(*args: object, **kwargs: object) -> object:
            seen.append(learner.optimizer.param_groups[0]["lr"])
            return step(*args, **kwargs)

        learner.optimizer.step = spy  # type: ignore[method-assign]
        return seen

    config = fp32(lr=0.04, lr_warmup_steps=4, mini_batch_size=2, shuffle=False)
    learner = Learner(make_model(), config)
    samples = on_policy_samples(learner, [1.0, -1.0, 0.5, 2.0, -0.5, 1.5])
    lrs = record_lrs(learner)
    first = learner.update(samples)  # three optimizer steps
    assert lrs == pytest.approx([0.01, 0.02, 0.03])
    assert first["lr"] == pytest.approx(0.03)
    learner.save(tmp_path / "ckpt")
    restored = Learner(make_model(), config)
    restored.load(tmp_path / "ckpt")
    resumed = record_lrs(restored)
    assert restored.update(samples)["lr"] == pytest.approx(0.04)
    assert resumed == pytest.approx([0.04, 0.04, 0.04])
    # Without a warm-up every step uses lr.
    plain = Learner(make_model(), fp32(lr=0.04, mini_batch_size=2))
    plain_lrs = record_lrs(plain)
    plain.update(samples)
    assert plain_lrs == pytest.approx([0.04] * 3)
    with pytest.raises(ValueError, match="lr_warmup_steps"):
        fp32(lr_warmup_steps=-1)


def test_lora_keeps_a_frozen_base_in_the_forward_dtype() -> None:
    """With bf16 autocast the frozen base is held in bf16 (half the memory, no cast per
    pass) while the trained adapters stay float32; in fp32 everything is float32."""
    bf16 = Learner(make_model(), LearnerConfig(dtype="bf16", lora=True, lora_r=4))
    for name, param in bf16.model.named_parameters():
        wanted = torch.float32 if param.requires_grad else torch.bfloat16
        assert param.dtype == wanted, name
    assert any(p.requires_grad for p in bf16.model.parameters())
    stats = bf16.update(on_policy_samples(bf16, [1.0, -1.0] * 4), old_logprobs="rescored")
    assert stats["steps"] >= 1 and math.isfinite(stats["loss"])
    plain = Learner(make_model(), fp32(lora=True, lora_r=4))
    assert all(p.dtype == torch.float32 for p in plain.model.parameters())


@pytest.mark.parametrize("lora", [False, True])
def test_save_load_restores_model_optimizer_and_rng(tmp_path: Path, lora: bool) -> None:
    config = fp32(lr=1e-2, mini_batch_size=3, lora=lora, lora_r=4)
    learner = Learner(make_model(), config)
    samples = on_policy_samples(learner, [1.0, -1.0, 0.5, 2.0, -0.5])
    learner.update(samples)
    ckpt = tmp_path / "ckpt"
    learner.save(ckpt)
    learner.save(ckpt)  # overwriting an existing checkpoint goes through the same renames
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]

    # LoRA checkpoints hold adapters only, so the base must match; full ones hold everything.
    restored = Learner(make_model(seed=0 if lora else 123), config)
    restored.load(ckpt)
    assert restored.step == learner.step
    for (name, a), b in zip(
        learner.model.named_parameters(), restored.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    state_a, state_b = (
        learner.optimizer.state_dict()["state"],
        restored.optimizer.state_dict()["state"],
    )
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state_a[key][field], state_b[key][field])
    # Same shuffling stream and optimizer moments: the next update is identical.
    learner.update(samples)
    restored.update(samples)
    for a, b in zip(learner.model.parameters(), restored.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_bf16_autocast_keeps_fp32_master_weights() -> None:
    learner = Learner(make_model(), LearnerConfig(lr=1e-3, dtype="bf16"))
    stats = learner.update(on_policy_samples(learner, [1.0, -1.0, 0.5]))
    assert all(math.isfinite(v) for v in stats.values())
    assert all(p.dtype == torch.float32 for p in learner.model.parameters())


def test_dtype_resolution(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx512f amx_bf16\n")
    assert cpu_supports_bf16(cpuinfo)
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx2\n")
    assert not cpu_supports_bf16(cpuinfo)
    assert not cpu_supports_bf16(tmp_path / "missing")
    cpu = torch.device("cpu")
    assert resolve_autocast_dtype("fp32", cpu) is None
    assert resolve_autocast_dtype("bf16", cpu) is torch.bfloat16
    assert resolve_autocast_dtype("auto", cpu) == (torch.bfloat16 if cpu_supports_bf16() else None)


def test_bad_inputs_raise() -> None:
    learner = Learner(make_model(), fp32())
    with pytest.raises(ValueError, match="no prompt tokens"):
        learner.update([([], [1, 2], [-1.0, -1.0], 1.0)])
    with pytest.raises(ValueError, match="log-probs"):
        learner.update([([1], [1, 2], [-1.0], 1.0)])
    with pytest.raises(TypeError, match="4-tuple"):
        learner.update([([1], [2])])
    assert learner.update([([1], [], [], 1.0)])["steps"] == 0  # nothing to train on
    with pytest.raises(ValueError, match="mini_batch_size"):
        LearnerConfig(mini_batch_size=0)
    with pytest.raises(ValueError, match="dtype"):
        LearnerConfig(dtype="fp16")  # type: ignore[arg-type]


def test_released_training_state_frees_the_moments_and_refuses_to_train(tmp_path: Path) -> None:
    learner = Learner(make_model(), fp32(lr=1e-3))
    samples = on_policy_samples(learner, [1.0, -1.0])
    learner.update(samples)
    assert learner.optimizer.state
    before = learner.compute_logprobs(samples)
    learner.release_training_state()
    assert not learner.optimizer.state
    assert all(p.grad is None for p in learner.params)
    assert learner.compute_logprobs(samples) == before  # the weights stay
    with pytest.raises(RuntimeError, match="released"):
        learner.update(samples)
    with pytest.raises(RuntimeError, match="released"):
        learner.save(tmp_path / "ckpt")
