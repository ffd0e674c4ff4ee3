"""Exact values of rock-paper-scissors against opponents that react to the history:
checked by hand, against a brute force over every deterministic policy, and the live
opponents against their models."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from mage_rl.envs import Population, make_env
from mage_rl.envs.rps import FAMILIES, MOVES, opponent_model, payoff
from mage_rl.envs.rps_values import rps_values


def _family(name: str) -> dict[str, float]:
    return {f"rps:{n}": 1.0 for n in FAMILIES[name]}


def test_values_by_hand() -> None:
    # Reactive opponents show which they are only in round 2 (their first move is
    # random), when they answer the agent's round-1 move; round 3 is then won.
    reactive = rps_values(_family("reactive"), 3)
    assert reactive.bayes_by_round == pytest.approx([0.0, 0.0, 1.0])
    # A cycle's first move is random; its second is one of two, and then it is known.
    assert rps_values(_family("cycles"), 3).bayes_by_round == pytest.approx([0.0, 0.5, 1.0])
    habits = rps_values(_family("habits"), 3)
    assert habits.bayes_by_round == pytest.approx([0.0, 1.0, 1.0]) and habits.ceiling == 1.0
    biased = rps_values(_family("biased"), 3)  # the closed form of a 0.6 habit
    assert biased.bayes_by_round[1] == pytest.approx(0.16) and biased.ceiling == pytest.approx(0.4)
    # A constant move against a reactive family: the copier draws, the beater wins, the
    # loser loses; their mean is 0 from round 2 on, as in round 1.
    assert reactive.fixed_by_round == pytest.approx([0.0, 0.0, 0.0])
    for v in (reactive, habits, biased):
        assert v.bayes_last_by_opponent and v.ceiling >= v.bayes_last >= v.best_fixed


def test_the_previous_move_rule_by_hand() -> None:
    """Answering what beats the opponent's previous move, from round 2 on."""
    habits = rps_values(_family("habits"), 4)
    assert habits.rule_by_round == pytest.approx([0.0, 1.0, 1.0, 1.0])
    # The rule wins when the habit repeats and loses when the move after it follows the
    # habit: (0.6 - 0.2) squared, every round from the second.
    assert rps_values(_family("biased"), 4).rule_by_round[1:] == pytest.approx([0.16] * 3)
    # A cycle one step up always plays what the rule's answer ties with, one step down
    # what beats it; the reactive opponents follow the agent's moves, which the rule's
    # random first move spreads evenly.
    cycles = rps_values(_family("cycles"), 4)
    assert cycles.rule_by_round[1:] == pytest.approx([-0.5] * 3)
    assert rps_values(_family("reactive"), 4).rule_by_round == pytest.approx([0.0] * 4)
    # Win-stay/lose-shift ties the rule for ever once it has not won; its mirror, which
    # repeats after a draw or a loss, is beaten for ever from round 3 on.
    outcome = rps_values(_family("outcome"), 4)
    assert outcome.rule_by_round[2:] == pytest.approx([0.5, 0.5])
    assert outcome.families["outcome"]["rule_last"] == pytest.approx(0.5)
    mixed = rps_values({**_family("habits"), **_family("cycles")}, 3)
    assert mixed.families["habits"]["rule_last"] == 1.0
    assert mixed.families["cycles"]["rule_last"] == -0.5
    assert mixed.rule_by_round[-1] == pytest.approx((3 * 1.0 + 2 * -0.5) / 5)


def test_the_sequence_population_is_told_apart_by_two_moves() -> None:
    """Habits and cycles, a half each: the second round cannot tell a habit from a cycle
    (a quarter of the way), two of the opponent's moves can (every later round won); the
    previous-move rule keeps the habits' +1 and the cycles' -0.5."""
    pop = Population.parse("rps_sequences_train", game="rock_paper_scissors")
    assert {s.split(":")[1] for s in pop.specs} == {*FAMILIES["habits"], *FAMILIES["cycles"]}
    values = rps_values(dict(zip(pop.specs, pop.weights, strict=True)), 4)
    assert values.bayes_by_round == pytest.approx([0.0, 0.25, 1.0, 1.0])
    assert values.rule_by_round == pytest.approx([0.0, 0.25, 0.25, 0.25])
    assert {f: e["weight"] for f, e in values.families.items()} == pytest.approx(
        {"habits": 0.5, "cycles": 0.5}
    )


def _brute_force(population: dict[str, float], k: int) -> tuple[float, float]:
    """The best last-round value over every deterministic policy, and the best constant
    move's. A policy is a move for every sequence of opponent moves seen so far (the
    agent's own earlier moves follow from it); the tables of the last round are all
    enumerated at once, the earlier ones one by one."""
    total = sum(population.values())
    models = [(w / total, opponent_model(s.split(":")[1])) for s, w in population.items()]
    seen = [list(itertools.product(range(3), repeat=t)) for t in range(k)]
    last = {s: i for i, s in enumerate(seen[k - 1])}
    every_last_table = np.array(list(itertools.product(range(3), repeat=len(last))))
    earlier = [list(itertools.product(range(3), repeat=len(seen[t]))) for t in range(k - 1)]
    best = -np.inf
    for choice in itertools.product(*earlier):
        plan = [dict(zip(seen[t], choice[t], strict=True)) for t in range(k - 1)]
        node = np.zeros((len(last), 3))  # a last move's value at each last-round node

        def walk(history, shown, prob, weight, model, plan=plan, node=node):
            probs = model(history)
            if len(history) == k - 1:
                for m in range(3):
                    node[last[shown], m] += (
                        weight * prob * sum(q * payoff(m, o) for o, q in enumerate(probs))
                    )
                return
            mine = plan[len(history)][shown]
            for o, q in enumerate(probs):
                if q > 0:
                    walk((*history, (mine, o)), (*shown, o), prob * q, weight, model)

        for weight, model in models:
            walk((), (), 1.0, weight, model)
        values = node[np.arange(len(last)), every_last_table].sum(axis=1)
        best = max(best, float(values.max()))
    constant = max(
        sum(
            w * p * q * payoff(move, o)
            for w, model in models
            for history, p in _paths(model, move, k - 1)
            for o, q in enumerate(model(history))
        )
        for move in range(3)
    )
    return best, constant


def _paths(model, move, rounds):
    """Every history of ``rounds`` rounds against ``model`` when the agent always plays
    ``move``, with its probability."""
    paths = [((), 1.0)]
    for _ in range(rounds):
        paths = [
            ((*h, (move, o)), p * q) for h, p in paths for o, q in enumerate(model(h)) if q > 0
        ]
    return paths


@pytest.mark.parametrize(
    ("population", "k"),
    [
        ("rps_families_train", 2),
        ("rps_families_unseen", 2),
        ("rps:copies_you=1,rps:cycle_up=2,rps:mostly_paper=1,rps:win_stay_lose_shift=1", 2),
        ("rps:beats_you=1,rps:loses_to_you=1,rps:always_rock=1", 3),
    ],
)
def test_values_match_a_brute_force_over_every_policy(population: str, k: int) -> None:
    pop = Population.parse(population, game="rock_paper_scissors")
    weights = dict(zip(pop.specs, pop.weights, strict=True))
    values = rps_values(weights, k)
    best, constant = _brute_force(weights, k)
    assert values.bayes_last == pytest.approx(best, abs=1e-12)
    assert values.best_fixed == pytest.approx(constant, abs=1e-12)
    assert sum(
        values.bayes_last_by_opponent[s] * w / sum(weights.values()) for s, w in weights.items()
    ) == pytest.approx(values.bayes_last)
    # Greedy play never beats the best plan for the last round.
    assert values.greedy_by_round[-1] <= values.bayes_last + 1e-12


@pytest.mark.parametrize("name", [n for names in FAMILIES.values() for n in names])
def test_the_live_opponent_plays_its_model(name: str) -> None:
    """The opponent in the game, against an agent answering what would beat the
    opponent's previous move, earns what enumerating its model says, per round."""
    model = opponent_model(name)
    k, n = 3, 1500

    def agent(history):
        return 0 if not history else (history[-1][1] + 1) % 3

    exact = np.zeros(k)

    def walk(history, prob):
        t = len(history)
        if t == k:
            return
        mine = agent(history)
        for o, q in enumerate(model(history)):
            if q > 0:
                exact[t] += prob * q * payoff(mine, o)
                walk((*history, (mine, o)), prob * q)

    walk((), 1.0)
    played = np.zeros(k)
    for task in range(n):
        env = make_env("rps", f"rps:{name}", seat=task % 2)
        history = []
        for t in range(k):
            env.reset(1000 * task + t)
            mine = agent(history)
            info = env.step(f"<action>{MOVES[mine]}</action>").info
            played[t] += info.payoff
            theirs = next(i for i in range(3) if payoff(mine, i) == info.payoff)
            history.append((mine, theirs))
    assert played / n == pytest.approx(exact, abs=0.08)


def test_oracle_command_prints_a_mixed_population() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mage_rl.cli", "oracle", "rps", "--population",
         "rps_families_train", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    values = json.loads(out.stdout)
    assert [v["episodes"] for v in values] == [1, 2, 3, 4, 5]
    four = values[3]
    assert four["bayes_by_round"][0] == 0.0 and four["bayes_last"] == pytest.approx(
        0.8044, abs=1e-4
    )
    assert set(four["families"]) == {"habits", "reactive", "cycles", "biased"}
