"""``GAME:llm:RUN_OR_MODEL`` opponents: a frozen model plays the other seat exactly as its
first-episode strategy, and the oracles read that strategy exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl import runtime  # noqa: F401  (registers the llm opponents)
from mage_rl.envs import make_opponent
from mage_rl.envs.llm_opponent import LLMOpponent, resolve_target
from mage_rl.envs.openspiel_env import decision_states
from mage_rl.eval.game_oracles import opponent_table
from mage_rl.nodes.state import graph_options
from mage_rl.players.model_reader import ModelReader
from mage_rl.players.played_config import played_config
from mage_rl.players.tree_decisions import agent_decisions, read_policy
from mage_rl.policy.models import load_model

CONFIGS = Path(__file__).parents[2] / "configs"


def _read_directly(seat: int) -> dict[str, list[tuple[int, float]]]:
    """The tiny model's first-episode strategy at ``seat``, as ``mage exploitability`` reads it."""
    cfg = played_config("tiny", "kuhn_poker", None, [])
    decisions = [
        d for d in agent_decisions("kuhn_poker", graph_options(cfg)) if d.seat == seat
    ]  # fmt: skip
    model, tokenizer = load_model("tiny", dtype=cfg.policy.dtype)
    return read_policy(decisions, ModelReader(model, tokenizer, cfg.policy.temperature))


def test_the_opponent_plays_the_models_exact_strategy() -> None:
    opponent = make_opponent("kuhn:llm:tiny")
    assert isinstance(opponent, LLMOpponent) and opponent.spec == "kuhn_poker:llm:tiny"
    # The oracles' table of the opponent (second seat) is the model's own, read directly.
    table = opponent_table("kuhn_poker", "kuhn_poker:llm:tiny", 1)
    direct = _read_directly(1)
    assert set(table) == set(direct) and len(table) == 6
    for key, dist in direct.items():
        got = dict(table[key])
        for action, p in dist:
            # The opponent scores one state at a time, the direct read in padded batches:
            # the same up to the model dtype's rounding (bf16 on a CPU that has it).
            assert got[action] == pytest.approx(p, abs=5e-3)
    # Its moves are draws from that distribution, with its own seeded generator.
    import pyspiel

    state = next(
        s for s in decision_states(pyspiel.load_game("kuhn_poker")) if s.current_player() == 1
    )
    probs = opponent.action_probabilities(state, 1)
    draws = []
    for seed in range(400):
        opponent.reset(seed)
        draws.append(opponent.act(state.clone(), 1))
    for action, p in probs.items():
        share = draws.count(action) / len(draws)
        assert abs(share - p) < 0.08, (action, share, p)
    opponent.reset(7)
    first = opponent.act(state.clone(), 1)
    opponent.reset(7)
    assert opponent.act(state.clone(), 1) == first


def test_bad_specs_say_how_to_write_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"kuhn_poker:llm:RUN_OR_MODEL\[@ITER\]"):
        make_opponent("kuhn:llm")
    with pytest.raises(ValueError, match="whole number"):
        resolve_target(f"{tmp_path}@last")
    with pytest.raises(ValueError, match="iteration 3 saved"):
        resolve_target(f"{tmp_path}@3")
    assert resolve_target("smollm2") == "smollm2"


def test_a_run_trains_against_an_llm_opponent_and_then_is_one(tmp_path: Path) -> None:
    from mage_rl.cli import main

    run = tmp_path / "run"
    overrides = [
        "--set", "train.iterations=1", "--set", "rollout.tasks=2", "--set", "rollout.group_size=2",
        "--set", "eval.tasks=0", "--set", "env.population=kuhn:llm:tiny=1,kuhn:aggressive=1",
    ]  # fmt: skip
    code = main(["train", str(CONFIGS / "kuhn_tiny.yaml"), "--run-dir", str(run),
                 "--no-progress", *overrides])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(key.startswith("charts/opponent/llm") for key in rows[0]), sorted(rows[0])
    # The trained checkpoint, named by iteration, is an opponent in its turn.
    target = resolve_target(f"{run}@1")
    assert Path(target) == run / "checkpoints" / "iter_000001" / "model"
    opponent = make_opponent(f"kuhn:llm:{run}@1")
    table = opponent_table("kuhn_poker", opponent, 0)
    assert len(table) == 6 and all(
        sum(p for _, p in dist) == pytest.approx(1.0) for dist in table.values()
    )


def test_the_oracles_value_an_llm_opponent_exactly() -> None:
    """The Kuhn oracle (its own tabular policies) and the generic game oracle (the
    opponent's table read at every information set) agree on a stochastic LLM opponent."""
    from mage_rl.envs import Population
    from mage_rl.eval.game_oracles import exploitation_values
    from mage_rl.eval.oracles import kuhn_oracle

    population = Population.parse("kuhn:llm:tiny=1,kuhn:aggressive=1", game="kuhn_poker")
    kuhn = kuhn_oracle(population)
    generic = exploitation_values("kuhn_poker", population)
    for seat in kuhn.seats:
        other = generic[seat.seat]
        assert seat.best_fixed == pytest.approx(other["best_fixed"], abs=1e-9)
        for spec, value in seat.best_response.items():
            assert value == pytest.approx(other["best_response"][spec], abs=1e-9)
    # The model mixes: the Kuhn oracle's policy of it is no pure strategy.
    from mage_rl.eval.oracles import opponent_policy

    probs = opponent_policy("kuhn_poker:llm:tiny", 1).action_probability_array
    assert ((probs > 0.01) & (probs < 0.99)).any()
