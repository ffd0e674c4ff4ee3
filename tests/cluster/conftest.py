"""Shared fixtures of the cluster tests (the flash-attn shim is set up in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


@pytest.fixture(scope="session")
def standin_rollout():
    """B=2 tasks x G=4 meta-episodes of the tiny model through two stand-in vLLM engines.

    Returns ``(cfg, model, tokenizer, standins, records)``.
    """
    from mage_rl import runtime
    from mage_rl.cluster.standin import LocalVLLMEngine, sampling_params_namespace
    from mage_rl.cluster.vllm_policy import VLLMEnginePolicy
    from mage_rl.config import TrainConfig, load_config
    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model

    cfg = load_config(CONFIG, ["rollout.concurrency=8"], TrainConfig)
    model, tokenizer = load_model("tiny", dtype="fp32")
    engines = [LocalEngine(model, tokenizer, seed=s) for s in (1, 2)]
    standins = [LocalVLLMEngine(e) for e in engines]
    policy = VLLMEnginePolicy(
        standins,
        tokenizer,
        max_model_len=4096,
        sampling_params_factory=sampling_params_namespace,
        name="standin",
    )
    llm = runtime.chat_model(policy, temperature=1.0, max_tokens=cfg.policy.max_tokens)
    tasks = runtime.tasks_for(cfg, cfg.rollout.tasks, cfg.rollout.seed)
    try:
        records = runtime.run_rollouts(cfg, runtime.build_graph(cfg), llm, tasks, 4)
    finally:
        for e in engines:
            e.close()
    return cfg, model, tokenizer, standins, records
