"""Meta-episodes driven by the tiny model through the real engine: the turn records are
token-exact, which is the on-policy guarantee the learner relies on."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mage_rl.envs import Population
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.graphs.rollouts import collect_rollouts, read_jsonl, sample_tasks, write_jsonl
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tiny import build_tiny
from mage_rl.policy.tokenization import render_prompt


@pytest.fixture(scope="module")
def records():
    model, tokenizer = build_tiny(seed=0)
    out = {}
    with LocalEngine(model, tokenizer, max_batch_size=16, batch_wait_ms=20) as engine:
        llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=24)
        for env, pop in (("kuhn_poker", "kuhn_train"), ("tic_tac_toe", "ttt_train")):
            tasks = sample_tasks(Population.parse(pop), 2, base_seed=3)
            graph = mage_graph(
                GraphOptions(
                    num_episodes=3, stop_on_success=False, max_tokens=24, reflect_max_tokens=24
                )
            )
            out[env] = asyncio.run(
                collect_rollouts(graph, llm, env_name=env, tasks=tasks, group_size=2,
                                 max_turns=3)
            )  # fmt: skip
    return model, tokenizer, out


@pytest.mark.parametrize("env", ["kuhn_poker", "tic_tac_toe"])
def test_meta_episodes_finish_with_k_episodes(records, env: str) -> None:
    _, _, out = records
    assert len(out[env]) == 4
    for record in out[env]:
        assert [e.index for e in record.episodes] == [0, 1, 2]
        kinds = [t.kind for t in record.turns]
        assert kinds.count("reflect") == 2
        # The group of a task is shared by its two rollouts.
    assert len({r.uid for r in out[env]}) == 2


@pytest.mark.parametrize("env", ["kuhn_poker", "tic_tac_toe"])
def test_turn_records_are_token_exact(records, env: str) -> None:
    model, tokenizer, out = records
    checked = 0
    for record in out[env]:
        for turn in record.turns:
            assert turn.response_ids and len(turn.logprobs) == len(turn.response_ids)
            assert tokenizer.decode(turn.response_ids, skip_special_tokens=True) == turn.text
            assert turn.prompt_ids == render_prompt(tokenizer, turn.prompt_text)
            with torch.no_grad():
                forced = teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids)
            assert torch.allclose(forced, torch.tensor(turn.logprobs), atol=1e-3)
            checked += 1
    assert checked >= 8


def test_records_round_trip_through_jsonl(records, tmp_path) -> None:
    _, _, out = records
    path = write_jsonl(out["kuhn_poker"], tmp_path / "r.jsonl")
    assert read_jsonl(path) == out["kuhn_poker"]
