"""Clients users run against the server: LangChain's ChatOpenAI, and a full Kuhn Poker
meta-episode played by :class:`~mage_rl.policy.openai_client.OpenAIPolicy` whose turn
records can be trained on."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from mage_rl.envs import Population
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.graphs.rollouts import collect_rollouts, sample_tasks
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.openai_client import OpenAIPolicy
from mage_rl.policy.scoring import teacher_forced_logprobs
from mage_rl.policy.tokenization import render_prompt
from mage_rl.rl.advantages import compute_advantages
from mage_rl.rl.batching import samples_from_records

from .conftest import MODEL

langchain_openai = pytest.importorskip("langchain_openai")


@pytest.fixture
def chat_openai(server):
    return langchain_openai.ChatOpenAI(
        model=MODEL, base_url=server.url, api_key="unused", max_tokens=10, seed=5,
        temperature=0.7, max_retries=0,
    )  # fmt: skip


def test_langchain_chat_openai_invoke_and_stream(chat_openai) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage

    messages = [SystemMessage("You play Kuhn Poker."), HumanMessage("Your card is Q.")]
    reply = chat_openai.invoke(messages)
    assert isinstance(reply.content, str)
    assert reply.response_metadata["model_name"] == MODEL
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    assert 1 <= reply.usage_metadata["output_tokens"] <= 10
    streamed = "".join(str(chunk.content) for chunk in chat_openai.stream(messages))
    assert streamed == reply.content  # same seed, same sample


def test_langchain_logprobs_and_async(chat_openai) -> None:
    llm = chat_openai.bind(logprobs=True)
    reply = asyncio.run(llm.ainvoke("Your card is J."))
    content = reply.response_metadata["logprobs"]["content"]
    assert len(content) == reply.usage_metadata["output_tokens"]
    assert all(entry["logprob"] <= 0 for entry in content)


def test_kuhn_meta_episode_through_the_endpoint_is_trainable(server) -> None:
    policy = OpenAIPolicy(server.url, MODEL, api_key="unused", timeout=60, max_retries=0)
    llm = PolicyChatModel(policy=policy, temperature=1.0, max_tokens=24)
    graph = mage_graph(
        GraphOptions(num_episodes=3, stop_on_success=False, max_tokens=24, reflect_max_tokens=24)
    )
    tasks = sample_tasks(Population.parse("kuhn_train"), 1, base_seed=11)
    records = asyncio.run(
        collect_rollouts(graph, llm, env_name="kuhn_poker", tasks=tasks, group_size=1, max_turns=3)
    )
    assert len(records) == 1
    record = records[0]
    assert [e.index for e in record.episodes] == [0, 1, 2]
    assert [t.kind for t in record.turns].count("reflect") == 2
    model, tokenizer = server.engine.model, server.engine.tokenizer
    for turn in record.turns:
        # Token ids and log-probs came back from the endpoint and match the local model.
        assert turn.prompt_ids == render_prompt(tokenizer, turn.prompt_text)
        assert turn.response_ids and len(turn.logprobs) == len(turn.response_ids)
        assert tokenizer.decode(turn.response_ids, skip_special_tokens=True) == turn.text
        with torch.no_grad():
            forced = teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids)
        assert torch.allclose(forced, torch.tensor(turn.logprobs), atol=1e-3)
    # The records go through the training pipeline's sample construction.
    samples = samples_from_records(records, compute_advantages(records))
    assert len(samples) == len(record.turns)


@pytest.mark.parametrize("keep", [True, False])
def test_mage_eval_over_the_endpoint_keeps_ids_on_request(server, tmp_path, keep) -> None:
    from mage_rl.cli import main
    from mage_rl.eval.eval_folder import records_path

    argv = ["eval", "--agent", "react=endpoint", "--endpoint", server.url]
    argv += ["--endpoint-model", MODEL, "--n", "2", "--max-tokens", "16", "--no-progress"]
    argv += ["--keep-ids" if keep else "--no-keep-ids", "--out", str(tmp_path)]
    assert main(argv) == 0
    lines = records_path(tmp_path, "react", "kuhn_poker").read_text().splitlines()
    turns = [t for line in lines for t in json.loads(line)["turns"]]
    assert turns
    tokenizer = server.engine.tokenizer
    for turn in turns:
        if keep:
            # What the server returned: the prompt it rendered, the sampled ids and their
            # log-probs, consistent with the recorded text.
            assert turn["prompt_ids"] == render_prompt(tokenizer, turn["prompt_text"])
            assert turn["response_ids"] and len(turn["logprobs"]) == len(turn["response_ids"])
            assert tokenizer.decode(turn["response_ids"], skip_special_tokens=True) == turn["text"]
        else:
            assert turn["prompt_ids"] == turn["response_ids"] == turn["logprobs"] == []
