"""The vLLM engine against the local model: a meta-episode's ids and log-probs, and
weight pushes that change what it samples."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mage_rl.envs import Population
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.graphs.rollouts import collect_rollouts, sample_tasks
from mage_rl.policy.base import SamplingParams
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tokenization import render_prompt
from mage_rl.rl.advantages import compute_advantages
from mage_rl.rl.batching import samples_from_records

from .conftest import VLLM

pytestmark = VLLM

# fp32 on both sides: vLLM's CPU kernels and one teacher-forced transformers pass differ
# by float rounding only (measured: see docs/policy.md, "vLLM's log-probs").
FP32_ATOL = 2e-3
PROMPT = [{"role": "user", "content": "Name a card in Kuhn Poker."}]


def _forced(model, gen) -> torch.Tensor:
    with torch.no_grad():
        return teacher_forced_logprobs(model, gen.prompt_ids, gen.response_ids)


def test_kuhn_meta_episode_ids_and_logprobs_match_a_teacher_forced_pass(
    engine, smollm2_fp32
) -> None:
    model, tokenizer = smollm2_fp32
    llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=32)
    graph = mage_graph(
        GraphOptions(num_episodes=3, stop_on_success=False, max_tokens=32, reflect_max_tokens=48)
    )
    tasks = sample_tasks(Population.parse("kuhn_train"), 1, base_seed=3)
    records = asyncio.run(
        collect_rollouts(graph, llm, env_name="kuhn_poker", tasks=tasks, group_size=1, max_turns=3)
    )
    gaps = []
    for record in records:
        assert [e.index for e in record.episodes] == [0, 1, 2]
        for turn in record.turns:
            # vLLM renders the chat with the same template: the ids the learner trains on.
            assert turn.prompt_ids == render_prompt(tokenizer, turn.prompt_text)
            assert turn.response_ids and len(turn.logprobs) == len(turn.response_ids)
            assert tokenizer.decode(turn.response_ids, skip_special_tokens=True) == turn.text
            with torch.no_grad():
                forced = teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids)
            gaps.append((forced - torch.tensor(turn.logprobs)).abs().max().item())
    # Shown with `pytest -rP`: the measured gap, which docs/policy.md quotes.
    print(f"largest fp32 log-prob gap {max(gaps):.2e} over {len(gaps)} turns")
    assert max(gaps) < FP32_ATOL, f"largest gap {max(gaps):.2e} over {len(gaps)} turns"
    samples = samples_from_records(records, compute_advantages(records))
    assert len(samples) == sum(len(r.turns) for r in records)


def test_processed_logprobs_follow_temperature_and_top_k(engine, smollm2_fp32) -> None:
    model, _ = smollm2_fp32
    params = SamplingParams(temperature=0.7, top_k=20, max_tokens=16, seed=4)
    gen = engine.generate_sync(PROMPT, params)
    with torch.no_grad():
        forced = teacher_forced_logprobs(
            model, gen.prompt_ids, gen.response_ids, temperature=0.7, top_k=20
        )
        raw = teacher_forced_logprobs(model, gen.prompt_ids, gen.response_ids)
    assert torch.allclose(forced, torch.tensor(gen.logprobs), atol=FP32_ATOL)
    assert not torch.allclose(raw, torch.tensor(gen.logprobs), atol=FP32_ATOL)


def test_ids_in_give_the_same_sample_as_the_chat(engine) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=9)
    chat = engine.generate_sync(PROMPT, params)
    from_ids = asyncio.run(_from_ids(engine, chat.prompt_ids, params))
    assert from_ids.response_ids == chat.response_ids
    assert from_ids.text == chat.text
    assert from_ids.logprobs == pytest.approx(chat.logprobs, abs=1e-4)


async def _from_ids(engine, ids, params):
    try:
        return await engine.generate_from_ids(ids, params)
    finally:
        await engine.aclose()


def test_weight_push_changes_the_next_samples(engine, smollm2_fp32) -> None:
    model, _ = smollm2_fp32
    greedy = SamplingParams(temperature=0.0, max_tokens=12)
    before = engine.generate_sync(PROMPT, greedy)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # New weights the server cannot have: every layer's MLP output scaled, the model
    # otherwise the same, so the text changes but stays a language model's.
    pushed = dict(original)
    for key in pushed:
        if key.endswith("mlp.down_proj.weight"):
            pushed[key] = original[key] * 1.7
    try:
        engine.update_weights(pushed)
        assert engine.weight_version == 1
        after = engine.generate_sync(PROMPT, greedy)
        assert after.response_ids != before.response_ids
        # The new samples' log-probs are those of the pushed weights, not the old ones.
        model.load_state_dict(pushed)
        sampled = engine.generate_sync(PROMPT, SamplingParams(max_tokens=16, seed=1))
        gap = (_forced(model, sampled) - torch.tensor(sampled.logprobs)).abs().max().item()
        assert gap < FP32_ATOL
    finally:
        model.load_state_dict(original)
        engine.update_weights(original)
    assert engine.generate_sync(PROMPT, greedy).response_ids == before.response_ids


def test_constrained_decoding_is_refused_with_the_reason(engine) -> None:
    params = SamplingParams(choices=("<action>BET</action>", "<action>PASS</action>"))
    with pytest.raises(NotImplementedError, match="allowed set"):
        engine.generate_sync(PROMPT, params)


def test_bf16_logprobs_stay_near_a_teacher_forced_pass(smollm2_fp32) -> None:
    """bf16 on the server: the gap to an fp32 teacher-forced pass is bf16 rounding, the
    size docs/policy.md quotes (why training recomputes old log-probs in bf16)."""
    from mage_rl.policy.vllm_engine import VLLMEngine

    model, _ = smollm2_fp32
    params = [SamplingParams(temperature=1.0, max_tokens=32, seed=i) for i in range(16)]

    async def sample(engine):
        return await asyncio.gather(*(engine.generate(PROMPT, p) for p in params))

    with VLLMEngine("smollm2", dtype="bf16", max_batch_size=16, name="smollm2") as engine:
        gens = asyncio.run(sample(engine))
    gaps = torch.cat([(_forced(model, g) - torch.tensor(g.logprobs)).abs() for g in gens])
    print(f"bf16 server vs fp32 pass: max {gaps.max():.3f}, mean {gaps.mean():.4f} nats "
          f"over {gaps.numel()} tokens")  # fmt: skip
    # Measured: max 0.27-0.62, mean 0.039-0.041 nats (docs/policy.md). The mean is the
    # check (a sample from another distribution is off by far more on average); single
    # tokens near a rounding tie can move further.
    assert gaps.mean() < 0.1 and gaps.max() < 2.0
