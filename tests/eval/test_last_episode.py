"""The last episode's strategy after sampled histories (SPEC §10): the prompts rebuilt for
episode K are the ones the graph sends, and a fixed strategy gets its exact values."""

from __future__ import annotations

import dataclasses
import math

import pytest

from mage_rl import runtime
from mage_rl.config import TrainConfig, load_config
from mage_rl.envs import Population, make_env
from mage_rl.envs.openspiel_env import decision_states
from mage_rl.envs.opponents import PlaceholderOpponent
from mage_rl.eval.last_episode import (
    check_config,
    history_tasks,
    last_episode_values,
    past_of,
)
from mage_rl.nodes.state import MetaEpisodeContext, graph_options
from mage_rl.players.model_reader import ModelReader
from mage_rl.players.tree_decisions import decision_at
from mage_rl.policy.conversation import ConversationTemplate
from tests.eval.test_exploitability import STRATEGIES, TableModel

BASE = [
    "env.name=kuhn_poker", "env.population=kuhn_train", "env.seat=sampled",
    "env.protocol=fresh", "meta.episodes=3", "meta.stop_on_success=false", "policy.model=tiny",
    "policy.dtype=fp32", "learner.dtype=fp32", "policy.constrain_actions=true",
    "policy.max_tokens=12", "eval.tasks=0",
]  # fmt: skip
LAYOUTS = {
    "conversation": ["meta.layout=conversation", "meta.prompt=compact", "meta.context=history"],
    "rerendered_reflection": ["meta.layout=rerendered", "meta.context=history+reflection"],
}  # fmt: skip
TRAIN = Population.parse("kuhn_train")


def _played(settings: list[str], n: int):
    cfg = load_config(None, [*BASE, *settings], TrainConfig)
    model, tokenizer = runtime.load_model("tiny", dtype="fp32")
    engine = runtime.build_engine(cfg.policy, model, tokenizer)
    try:
        tasks = history_tasks(TRAIN.specs, n, base_seed=3)
        chat = runtime.rollout_chat_model(cfg, engine)
        records = runtime.run_rollouts(cfg, runtime.build_graph(cfg), chat, tasks, 1)
    finally:
        engine.close()
    template = ConversationTemplate(tokenizer) if cfg.meta.layout == "conversation" else None
    return cfg, model, tokenizer, records, template


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_last_episodes_prompts_are_the_graphs_and_read_as_it_samples(layout: str) -> None:
    cfg, model, tokenizer, records, template = _played(LAYOUTS[layout], 4)
    reader = ModelReader(model, tokenizer, cfg.policy.temperature, batch_size=8)
    options = dataclasses.replace(graph_options(cfg), constrain_actions=True)
    checked = 0
    for record in records:
        past = past_of(record, cfg, template)
        assert past.episode == 2 and len(past.history) == 2
        assert (past.chat is not None) == (template is not None)
        env = make_env("kuhn_poker", PlaceholderOpponent(), seat=record.seat)
        env.reset(0)
        ctx = MetaEpisodeContext(env=env, llm=None, options=options)  # type: ignore[arg-type]
        states = [s for s in decision_states(env.game) if s.current_player() == record.seat]
        decisions = [decision_at(env, ctx, s, past) for s in states]
        reads = reader.read(decisions)
        by_prompt = {tuple(r.prompt_ids): r for r in reads}
        for turn in record.turns:
            if turn.kind != "play" or turn.episode != 2:
                continue
            # The graph's prompt in the last episode is the one rebuilt for that state...
            read = by_prompt[tuple(turn.prompt_ids)]
            # ...and its answer was drawn with the probability read there.
            index = read.decision.choices.index(turn.text)
            assert math.exp(sum(turn.logprobs)) == pytest.approx(
                read.probabilities[index], rel=1e-4
            )
            checked += 1
    assert checked >= len(records)  # every last episode has at least one play call


def test_a_fixed_strategy_gets_its_exact_values_after_every_history() -> None:
    cfg, _, _, records, template = _played(LAYOUTS["rerendered_reflection"], 2)
    bet = TableModel(STRATEGIES["always_bet"]())
    last = last_episode_values(cfg, records, bet, {"kuhn_train": TRAIN}, template)
    first, second, mean = last["seats"]
    assert last["histories"] == {f"{s} {seat}": 2 for s in TRAIN.specs
                                 for seat in ("first", "second")}  # fmt: skip
    # Whatever the history, always bet: SPEC §10's values, with intervals of width 0.
    assert first["vs_population"]["kuhn_train"]["mean"] == pytest.approx(-0.1, abs=1e-9)
    assert second["vs_population"]["kuhn_train"]["mean"] == pytest.approx(-2 / 15, abs=1e-9)
    assert first["vs_opponent"]["kuhn_poker:aggressive"]["mean"] == pytest.approx(-1 / 3)
    assert mean["vs_best_response"]["mean"] == pytest.approx(-1 / 3, abs=1e-9)
    est = first["vs_opponent"]["kuhn_poker:conservative"]
    assert est["low"] == pytest.approx(est["high"]) and est["n"] == 2


def test_a_config_that_may_not_reach_its_last_episode_is_refused() -> None:
    one = load_config(None, [*BASE, "meta.episodes=1"], TrainConfig)
    with pytest.raises(ValueError, match="K >= 2"):
        check_config(one)
    stops = load_config(None, [*BASE, "meta.stop_on_success=true"], TrainConfig)
    with pytest.raises(ValueError, match="stop_on_success=false"):
        check_config(stops)
