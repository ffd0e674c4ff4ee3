"""The conversation layout wired into the meta-episode (SPEC §2): every call is sampled
from the chat's exact ids, the record carries the chat, the learner trains it as one
sequence, and a config that would outgrow the context is refused before anything runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel

from mage_rl.cli import main
from mage_rl.envs import make_env
from mage_rl.graphs import GraphOptions, build_meta_episode_graph, mage_graph
from mage_rl.policy.tiny import build_tiny
from mage_rl.rl.advantages import compute_advantages
from mage_rl.rl.batching import samples_from_records
from mage_rl.rl.conversation import ConversationSample
from mage_rl.rl.learner import Learner, LearnerConfig
from tests.graphs.conftest import tiny_kuhn_rollouts

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


@pytest.fixture(scope="module")
def records():
    options = GraphOptions(num_episodes=3, stop_on_success=False, max_tokens=12,
                           reflect_max_tokens=12, layout="conversation",
                           constrain_actions=True, prompt="compact")  # fmt: skip
    return tiny_kuhn_rollouts(options, tasks=2, group_size=2, base_seed=1, batch=16)


def test_every_call_extends_the_previous_one_without_retokenizing(records) -> None:
    tokenizer, out = records
    for record in out:
        turns = record.turns
        assert {t.kind for t in turns} == {"play", "reflect"}
        for before, after in zip(turns, turns[1:], strict=False):
            grown = before.prompt_ids + before.response_ids
            assert after.prompt_ids[: len(grown)] == grown
        trace = record.conversation
        assert trace is not None and len(trace["segments"]) == len(turns)
        for (start, end, _), turn in zip(trace["segments"], turns, strict=True):
            assert trace["ids"][start:end] == turn.response_ids
            assert trace["ids"][:start] == turn.prompt_ids
        text = tokenizer.decode(trace["ids"])
        assert "Episode 2 of 3 starts." in text and "<remark></remark>" in text


def test_the_learner_trains_each_meta_episode_as_one_sequence(records) -> None:
    _, out = records
    samples = samples_from_records(out, compute_advantages(out))
    assert len(samples) == len(out)
    assert all(isinstance(s, ConversationSample) for s in samples)
    assert [len(s.segments) for s in samples] == [len(r.turns) for r in out]
    learner = Learner(build_tiny(seed=0)[0], LearnerConfig(dtype="fp32", lr=1e-3))
    stats = learner.update(samples)
    assert stats["loss"] == stats["loss"]


@pytest.mark.parametrize("context", ["history", "none"])
def test_contexts_without_reflections_tell_each_outcome_in_the_chat(context: str) -> None:
    options = GraphOptions(num_episodes=2, stop_on_success=False, max_tokens=12,
                           layout="conversation", context=context,
                           constrain_actions=True, prompt="compact")  # fmt: skip
    tokenizer, (record,) = tiny_kuhn_rollouts(options, tasks=1, group_size=1, base_seed=3)
    assert {t.kind for t in record.turns} == {"play"}
    text = tokenizer.decode(record.conversation["ids"])
    assert "Episode 1 of 2 is over:" in text and "Episode 2 of 2 starts." in text


def test_the_layout_refuses_what_it_cannot_do() -> None:
    options = GraphOptions(num_episodes=1, layout="conversation")
    with pytest.raises(ValueError, match="policy graph renders its own prompts"):
        build_meta_episode_graph(options, policy=mage_graph().compiled)
    text_only = FakeListChatModel(responses=["<action>PASS</action>"])
    env = make_env("kuhn", "kuhn:aggressive", seat=0)
    with pytest.raises(ValueError, match="needs a chat model over an engine with a tokenizer"):
        asyncio.run(mage_graph(options).run(env, text_only, task_seed=1,
                                            opponent="kuhn_poker:aggressive"))  # fmt: skip
    with pytest.raises(ValueError, match="unknown layout"):
        GraphOptions(layout="chat")


def test_mage_train_in_the_conversation_layout(tmp_path: Path, capsys) -> None:
    run = tmp_path / "conv"
    assert main(["train", str(CONFIG), "--run-dir", str(run), "--no-progress",
                 "--set", "meta.layout=conversation", "--set", "meta.prompt=compact",
                 "--set", "train.iterations=1", "--set", "eval.tasks=2"]) == 0  # fmt: skip
    assert (run / "checkpoints" / "iter_000001").exists()
    # K = 10 episodes of 4 turns with 600-token answers cannot fit the tiny model's 4,096.
    too_long = tmp_path / "too_long"
    assert main(["train", str(CONFIG), "--run-dir", str(too_long), "--no-progress",
                 "--set", "meta.layout=conversation", "--set", "meta.episodes=10",
                 "--set", "policy.max_tokens=600"]) == 2  # fmt: skip
    assert "contextwindowis4096" in "".join(capsys.readouterr().out.split())
    assert not too_long.exists()  # refused before the run folder was made
