"""policy.answer_lead: a constrained answer restates the private fact (Kuhn Poker: the
card) before its action tag, forced by the decoder, so the one free token that picks the
action sits right next to it."""

from __future__ import annotations

import asyncio
import re

import pytest

from mage_rl.config import RunConfig
from mage_rl.envs import make_env
from mage_rl.envs.parsing import extract_action
from mage_rl.graphs import GraphOptions, mage_graph
from mage_rl.policy.chat_model import PolicyChatModel
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny
from tests.graphs.conftest import tiny_kuhn_rollouts


@pytest.mark.parametrize("layout", ["conversation", "rerendered"])
def test_every_answer_names_the_card_then_chooses(layout: str) -> None:
    options = GraphOptions(num_episodes=2, stop_on_success=False, max_tokens=12,
                           context="history", layout=layout, prompt="compact",
                           constrain_actions=True, answer_lead=True)  # fmt: skip
    tokenizer, out = tiny_kuhn_rollouts(options, tasks=2, group_size=2, base_seed=4)
    plays = [t for r in out for t in r.turns if t.kind == "play"]
    assert len(plays) >= 8
    for turn in plays:
        (card,) = re.findall(r"[Cc]ard:? ([JQK])", turn.anchor)[-1:]
        assert re.fullmatch(rf"{card} <action>(BET|PASS)</action>", turn.text), turn.text
        assert not turn.invalid and extract_action(turn.text) in ("BET", "PASS")
        # One free choice; the card and the tag around the action are forced.
        free = [i for i, allowed in enumerate(turn.allowed) if len(allowed) > 1]
        assert len(free) == 1
        assert tokenizer.decode(turn.response_ids[: free[0]]) == f"{card} <action>"


def test_the_lead_is_the_seats_private_information() -> None:
    kuhn = make_env("kuhn", "kuhn:aggressive", seat=0)
    kuhn.reset(5)  # agent Q
    assert kuhn.answer_lead == "Q" and "card Q" in kuhn.brief_observation
    leduc = make_env("leduc", "leduc:random", seat=1)
    leduc.reset(3)
    mine = leduc.brief_observation.split(",")[0].removeprefix("card ")
    assert leduc.answer_lead == mine  # no board card before round 2
    dice = make_env("liars_dice", "liars_dice:random", seat=0)
    dice.reset(2)
    assert dice.answer_lead == dice.brief_observation.split(",")[0]
    ttt = make_env("tictactoe", "tictactoe:random", seat=0)
    ttt.reset(1)
    assert ttt.answer_lead == ""


def test_answer_lead_is_refused_where_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="turn constrain_actions on"):
        GraphOptions(answer_lead=True)
    with pytest.raises(ValueError, match="policy.constrain_actions: true"):
        RunConfig.model_validate({"policy": {"model": "tiny", "answer_lead": True}})
    # Tic-tac-toe has no private fact: the first play call says so.
    model, tokenizer = build_tiny(seed=0)
    options = GraphOptions(num_episodes=1, max_tokens=12, prompt="compact",
                           constrain_actions=True, answer_lead=True)  # fmt: skip
    with LocalEngine(model, tokenizer, max_batch_size=2) as engine:
        llm = PolicyChatModel(policy=engine, temperature=1.0, max_tokens=12)
        env = make_env("tictactoe", "tictactoe:random", seat=0)
        with pytest.raises(ValueError, match="names no lead"):
            asyncio.run(mage_graph(options).run(env, llm, task_seed=1,
                                                opponent="tictactoe:random"))  # fmt: skip


def test_mage_eval_carries_the_lead_into_the_graph() -> None:
    from mage_rl.eval.conditions import AgentSpec, EvalConfig

    agents = [AgentSpec("mage", "mage", "tiny")]
    cfg = EvalConfig(agents=agents, envs=["kuhn"], n=2, constrain_actions=True, answer_lead=True)
    from mage_rl.runtime import graph_options

    assert cfg.agents[0].play["answer_lead"]
    assert graph_options(cfg.agent_config(cfg.agents[0], "kuhn_poker")).answer_lead
    with pytest.raises(ValueError, match="answer_lead is written by constrained decoding"):
        EvalConfig(agents=agents, envs=["kuhn"], n=2, answer_lead=True)
