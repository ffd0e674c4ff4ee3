from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import BaseMessage

from mage_rl.envs import Population
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.graphs.rollouts import collect_rollouts, sample_tasks
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny
from mage_rl.records import MetaEpisodeRecord


def tiny_kuhn_rollouts(
    options: GraphOptions, *, tasks: int, group_size: int, base_seed: int, batch: int = 8
) -> tuple[Any, list[MetaEpisodeRecord]]:
    """MAGE rollouts of a fresh tiny model on Kuhn Poker against the training population
    (answers of at most 12 tokens, 3 turns per hand); returns the tokenizer and records."""
    model, tokenizer = build_tiny(seed=0)
    with LocalEngine(model, tokenizer, max_batch_size=batch) as engine:
        llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=12)
        specs = sample_tasks(Population.parse("kuhn_train"), tasks, base_seed=base_seed)
        out = asyncio.run(collect_rollouts(mage_graph(options), llm, env_name="kuhn_poker",
                                           tasks=specs, group_size=group_size, max_turns=3))  # fmt: skip
    return tokenizer, out


class ScriptedChat(FakeListChatModel):
    """Answers play turns from one script and reflect turns from another, and keeps
    every prompt it saw."""

    reflections: list[str] = []
    seen: list[list[BaseMessage]] = []
    reflect_i: int = 0

    def _call(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> str:
        self.seen.append(messages)
        if "<remark>" in messages[-1].content:
            text = self.reflections[self.reflect_i % len(self.reflections)]
            self.reflect_i += 1
            return text
        return super()._call(messages, *args, **kwargs)
