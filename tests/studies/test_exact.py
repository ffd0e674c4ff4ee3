"""The adaptation study's exact evaluation against the enumerated values (SPEC §9)."""

from __future__ import annotations

import numpy as np
import pytest

from mage_rl.envs import Population
from mage_rl.eval.bayes import hand_table
from studies.adaptation import CONFIG
from studies.adaptation.exact import deal_sequence_seeds, exact_ev, exact_eval_tasks
from studies.adaptation.study import METHODS, method_config
from tests.graphs.conftest import ScriptedChat

POPULATION = Population.parse("kuhn_train", game="kuhn_poker")


def test_exact_evaluation_matches_the_enumerated_value_of_a_fixed_strategy() -> None:
    """Always PASS, played through the real graph and environment on every deal sequence,
    earns exactly what the enumeration says."""
    from mage_rl import runtime

    seeds = deal_sequence_seeds(2)
    assert len(seeds) == 36 and len(set(seeds)) == 36
    _, cfg = method_config(
        CONFIG,
        METHODS["mage"],
        "first",
        0,
        1,
        ["meta.episodes=2", "policy.constrain_actions=false"],
    )
    tasks, weights = exact_eval_tasks(cfg, 0, seeds)
    assert sum(weights) == pytest.approx(1.0)
    chat = ScriptedChat(responses=["<action>PASS</action>"])
    records = runtime.run_rollouts(cfg, runtime.build_graph(cfg), chat, tasks, 1)
    result = exact_ev(records, weights, 2)
    table = hand_table(POPULATION.specs, 0)
    always_pass = 0  # strategy index 0 is PASS at every information set
    expected = float(table.values[always_pass] @ np.asarray(POPULATION.weights))
    assert result["ev_by_episode"] == pytest.approx([expected, expected], abs=1e-9)
    assert result["ev_by_opponent"]["kuhn_poker:aggressive"][0] == pytest.approx(-1.0)
