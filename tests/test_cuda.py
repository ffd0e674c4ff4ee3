"""The engine and the learner on CUDA, with the tiny model (``pytest -m gpu``).

Every test runs once per device: on the CPU everywhere, so the checks themselves cannot
rot on machines without a GPU, and on CUDA (marked ``gpu``, skipped without one).
``bash scripts/gpu_check.sh device`` runs the CUDA half on a lent GPU machine.
"""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch

from mage_rl.policy.base import SamplingParams
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tiny import build_tiny
from mage_rl.rl.batching import Sample
from mage_rl.rl.learner import Learner, LearnerConfig

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]
PROMPTS = [[5 + (7 * i + j) % 200 for j in range(4 + 3 * i)] for i in range(6)]  # ragged


def tiny_on(device: str, dtype: torch.dtype = torch.float32):
    model, tokenizer = build_tiny(seed=0, dtype=dtype)
    return model.to(device), tokenizer


def generate(engine: LocalEngine, params: list[SamplingParams], prompts=PROMPTS, **kwargs):
    async def main():
        calls = (
            engine.generate_from_ids(p, s, **kwargs) for p, s in zip(prompts, params, strict=True)
        )
        return await asyncio.gather(*calls)

    return asyncio.run(main())


@pytest.mark.parametrize("device", DEVICES)
def test_engine_batches_and_its_logprobs_match_teacher_forcing(device: str) -> None:
    model, tokenizer = tiny_on(device)
    params = [SamplingParams(max_tokens=8 + i, seed=i) for i in range(len(PROMPTS))]
    with LocalEngine(model, tokenizer, max_batch_size=8, batch_wait_ms=50) as engine:
        generations = generate(engine, params)
        assert engine.stats.batches == 1 and engine.stats.largest_batch == len(PROMPTS)
    for generation, p in zip(generations, params, strict=True):
        assert 1 <= len(generation.response_ids) <= p.max_tokens
        with torch.no_grad():
            forced = teacher_forced_logprobs(model, generation.prompt_ids, generation.response_ids)
        assert forced.device.type == device
        gap = (forced.cpu() - torch.tensor(generation.logprobs)).abs().max().item()
        assert gap < 1e-3, gap


@pytest.mark.parametrize("device", DEVICES)
def test_static_decode_gives_the_growing_caches_tokens(device: str) -> None:
    # On CUDA the decode step is replayed from CUDA graphs; on the CPU it runs eagerly
    # over the same buffers. Rows leave at different steps, and the longest outgrows the
    # first buffers, so the cache is copied in again and a new graph captured.
    model, tokenizer = tiny_on(device)
    mode = "graphs" if device == "cuda" else "eager"
    params = [SamplingParams(max_tokens=20 + 45 * i, temperature=0.0) for i in range(6)]
    runs = {}
    for static in ("off", mode):
        with LocalEngine(model, tokenizer, max_batch_size=8, batch_wait_ms=50,
                         static_decode=static) as engine:  # fmt: skip
            runs[static] = generate(engine, params, ignore_eos=True), engine.stats
    stats = runs[mode][1]
    for a, b in zip(runs["off"][0], runs[mode][0], strict=True):
        assert a.response_ids == b.response_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3
    assert stats.graph_failures == 0 and stats.static_copies >= 7
    if device == "cuda":
        assert stats.graph_captures >= 2 and stats.graph_steps == stats.steps - 1


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_engine_decodes_finite_logprobs(device: str) -> None:
    model, tokenizer = tiny_on(device, torch.bfloat16)
    params = [SamplingParams(max_tokens=6, seed=i) for i in range(len(PROMPTS))]
    with LocalEngine(model, tokenizer, max_batch_size=8, batch_wait_ms=50) as engine:
        generations = generate(engine, params)
    for generation in generations:
        assert generation.response_ids
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in generation.logprobs)


@pytest.mark.parametrize("device", DEVICES)
def test_learner_scores_engine_samples_at_ratio_one_and_trains(device: str) -> None:
    model, tokenizer = tiny_on(device)
    params = [SamplingParams(max_tokens=6, seed=i) for i in range(len(PROMPTS))]
    with LocalEngine(copy.deepcopy(model), tokenizer, max_batch_size=8) as engine:
        generations = generate(engine, params)
    learner = Learner(model, LearnerConfig(lr=1e-3, dtype="fp32", entropy_coef=0.0))
    assert learner.device.type == device
    samples = [
        Sample(g.prompt_ids, g.response_ids, g.logprobs, 1.0 if i % 2 else -1.0)
        for i, g in enumerate(generations)
    ]
    rescored = learner.compute_logprobs(samples)
    for generation, logprobs in zip(generations, rescored, strict=True):
        assert max(abs(a - b) for a, b in zip(logprobs, generation.logprobs, strict=True)) < 1e-3
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    stats = learner.update(samples)
    assert stats["clip_frac"] == 0.0 and abs(stats["approx_kl"]) < 1e-5
    assert all(math.isfinite(v) for v in stats.values())
    assert all(not torch.equal(p, before[n]) for n, p in learner.model.named_parameters())


@pytest.mark.parametrize("device", DEVICES)
def test_micro_batches_give_the_same_gradient(device: str) -> None:
    model, _ = tiny_on(device)
    samples = [Sample(p, [9, 10, 11], [-1.0] * 3, 0.5) for p in PROMPTS]
    grads = []
    for micro in (10_000, 24):
        learner = Learner(
            copy.deepcopy(model), LearnerConfig(dtype="fp32", kl_coef=0.1, micro_batch_tokens=micro)
        )
        learner.accumulate_gradients(samples)
        grads.append([p.grad.detach().clone() for p in learner.params])
    for whole, split in zip(*grads, strict=True):
        torch.testing.assert_close(whole, split, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_learner_keeps_fp32_master_weights_and_feeds_a_bf16_engine(device: str) -> None:
    model, tokenizer = tiny_on(device)
    learner = Learner(model, LearnerConfig(lr=1e-3, dtype="bf16", kl_coef=0.1))
    samples = [Sample(p, [9, 10, 11], [-1.0] * 3, 1.0) for p in PROMPTS]
    old = learner.compute_logprobs(samples)
    samples = [
        Sample(s.prompt_ids, s.response_ids, lp, 1.0) for s, lp in zip(samples, old, strict=True)
    ]
    stats = learner.update(samples)
    assert all(math.isfinite(v) for v in stats.values())
    assert all(p.dtype == torch.float32 and p.device.type == device for p in learner.params)
    engine_model, _ = tiny_on(device, torch.bfloat16)
    with LocalEngine(engine_model, tokenizer) as engine:
        engine.update_weights(learner.state_dict_for_inference())
        assert engine.weight_version == 1
        trained = dict(learner.model.named_parameters())
        for name, p in engine.model.named_parameters():
            assert p.dtype == torch.bfloat16
            torch.testing.assert_close(p, trained[name].to(torch.bfloat16))
        (generation,) = generate(engine, [SamplingParams(max_tokens=3)], PROMPTS[:1])
        assert generation.response_ids  # the engine still answers after the swap


@pytest.mark.parametrize("device", DEVICES)
def test_hardware_bench_runs(device: str) -> None:
    from mage_rl.bench.hardware import bench_hardware, format_hardware_report

    result = bench_hardware(
        model="tiny", device=device, samples=2, prompt_len=12, response_len=3, repeats=1,
        batch_sizes=(1, 2), decode_tokens=3, matmul_size=128, copy_mib=4, profile=True,
    )  # fmt: skip
    assert "error" not in result["learner"] and "error" not in result["engine"]
    assert result["learner"]["share"] > 0 and result["engine"]["batches"]["2"]["tokens_per_s"] > 0
    for batch in result["engine"]["batches"].values():
        assert batch["bare_step_s"] > 0 and batch["engine_over_bare"] > 0
        traced = batch["profile"]
        assert traced["engine_thread_found"] and traced["ops"]
        assert sum(p["share"] for p in traced["python"]) == pytest.approx(1.0, abs=0.2)
    report = format_hardware_report(result)
    assert (
        "Learner" in report and "engine / bare" in report and "Engine thread at batch 2" in report
    )
