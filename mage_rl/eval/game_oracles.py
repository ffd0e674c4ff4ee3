"""Exact reference values for any two-player OpenSpiel game against fixed opponents.

The game-generic form of :mod:`mage_rl.eval.oracles` (which keeps Kuhn Poker's analytic
equilibrium and its extra tables). Values are for the agent, per game, in the game's own
payoff: chips for Leduc Hold'em, +1/-1 for Liar's Dice.

1. Each opponent becomes a table ``{information state: [(action, probability), ...]}``
   over the information sets of its seat: the exact distribution where the opponent
   offers one (``action_probabilities(state, player)``, as random opponents do), else
   the action it picks at one state of the set (deterministic opponents; one that acts
   differently under two seeds is refused).
2. Nash value: Kuhn has a closed form, these games do not. The average profile
   ``(s0, s1)`` of CFR+ after N iterations (:func:`~mage_rl.envs.policy_opponents.solve_cfr_plus`)
   bounds the value ``v`` of the first seat from both sides, whatever N:
   ``-BR_1(s0) <= v <= BR_0(s1)``, where ``BR_p(s)`` is what a best response in seat p
   earns against ``s``. The midpoint is reported with the interval.
3. Best response to one opponent: OpenSpiel's C++ ``TabularBestResponse``.
4. Best *fixed* strategy against a weighted population: the best response to the
   behaviour strategy that plays ``a`` at information set ``I`` with probability
   ``sum_i w_i r_i(I) pi_i(a|I) / sum_i w_i r_i(I)`` (Kuhn's theorem), ``r_i(I)`` being
   opponent i's own reach of ``I``: with perfect recall, the product of its own action
   probabilities along any history of ``I``.
5. Opponent-aware ceiling: ``sum_i w_i BR(pi_i)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import pyspiel

from mage_rl.envs import Population, canonical_game, canonical_spec, game_rules, make_opponent
from mage_rl.envs.openspiel_env import decision_states
from mage_rl.envs.opponents import Opponent
from mage_rl.envs.policy_opponents import PolicyTable, solve_cfr_plus

NASH_ITERATIONS = {"leduc_poker": 500, "liars_dice": 200}
"""CFR+ iterations behind the Nash interval, per game (200 for other games)."""


@lru_cache(maxsize=8)
def _decision_states(game_name: str) -> tuple[pyspiel.State, ...]:
    return tuple(decision_states(pyspiel.load_game(game_name)))


def opponent_table(game_name: str, opponent: Opponent | str, seat: int) -> PolicyTable:
    """The opponent's action distribution at every information set of ``seat``.

    Raises:
        ValueError: The opponent acts at random but gives no ``action_probabilities``.
    """
    spec = opponent if isinstance(opponent, str) else opponent.spec
    if isinstance(opponent, str):
        opponent = make_opponent(opponent)
    exact = getattr(opponent, "action_probabilities", None)
    table: PolicyTable = {}
    for state in _decision_states(game_name):
        if state.current_player() != seat:
            continue
        key = state.information_state_string(seat)
        if key in table:  # the opponent sees the same in every state of the set
            continue
        # Every legal action gets an entry, zero or not: OpenSpiel's best response
        # reads a missing one as an error.
        dist = dict.fromkeys(state.legal_actions(seat), 0.0)
        if exact is not None:
            dist.update(exact(state.clone(), seat))
            table[key] = sorted(dist.items())
            continue
        picks = set()
        for seed in (0, 1):
            opponent.reset(seed)
            picks.add(int(opponent.act(state.clone(), seat)))
        if len(picks) > 1:
            raise ValueError(
                f"opponent {spec!r} acts at random and gives no action_probabilities(state, "
                "player); the oracle needs its exact action probabilities"
            )
        dist[picks.pop()] = 1.0
        table[key] = sorted(dist.items())
    return table


def own_reach(game_name: str, table: PolicyTable, seat: int) -> dict[str, float]:
    """Probability that ``seat``, playing ``table``, takes its own actions leading to
    each of its information sets (step 4 of the module docstring)."""
    game = pyspiel.load_game(game_name)
    reach: dict[str, float] = {}
    for state in _decision_states(game_name):
        if state.current_player() != seat:
            continue
        key = state.information_state_string(seat)
        if key in reach:  # perfect recall: one own-action path per information set
            continue
        replay = game.new_initial_state()
        probability = 1.0
        for action in state.history():
            if not replay.is_chance_node() and replay.current_player() == seat:
                dist = dict(table[replay.information_state_string(seat)])
                probability *= dist.get(int(action), 0.0)
            replay.apply_action(action)
        reach[key] = probability
    return reach


def mixture_table(
    game_name: str, tables: Sequence[PolicyTable], weights: Sequence[float], seat: int
) -> PolicyTable:
    """The behaviour strategy of the weighted mixture of ``tables`` (one per opponent)."""
    reaches = [own_reach(game_name, t, seat) for t in tables]
    mixed: PolicyTable = {}
    for key in tables[0]:
        numer: dict[int, float] = {}
        denom = 0.0
        for w, table, reach in zip(weights, tables, reaches, strict=True):
            mass = w * reach[key]
            denom += mass
            for action, p in table[key]:
                numer[action] = numer.get(action, 0.0) + mass * p
        if denom > 0:
            mixed[key] = sorted((a, n / denom) for a, n in numer.items())
        else:  # no opponent reaches it, so it does not matter; any distribution will do
            mixed[key] = tables[0][key]
    return mixed


def best_response_value(game_name: str, table: PolicyTable, agent_seat: int) -> float:
    """What a best response in ``agent_seat`` earns per game against ``table``."""
    return best_response_values(game_name, [table], agent_seat)[0]


def best_response_values(
    game_name: str, tables: Sequence[PolicyTable], agent_seat: int
) -> list[float]:
    """:func:`best_response_value` against each of ``tables``, in order.

    One OpenSpiel best-response object serves them all (its game tree is built once;
    each table replaces the policy), which is most of the cost on the larger games.
    """
    game = pyspiel.load_game(game_name)
    solver = None
    values = []
    for table in tables:
        if solver is None:
            solver = pyspiel.TabularBestResponse(game, agent_seat, dict(table))
        else:
            solver.set_policy(dict(table))
        values.append(float(solver.value("")))
    return values


def nash_bounds(game_name: str, iterations: int) -> tuple[float, float]:
    """``(low, high)`` around the first seat's equilibrium value (step 2)."""
    average = solve_cfr_plus(game_name, iterations)
    first = best_response_value(game_name, average, 0)
    second = best_response_value(game_name, average, 1)
    return -second, first


@dataclass
class GameSeatValues:
    """Reference values for one agent seat, per game in the game's payoff."""

    seat: str
    nash: float
    nash_low: float
    nash_high: float
    best_response: dict[str, float]
    best_fixed: float
    ceiling: float


@dataclass
class GameOracle:
    """Every value of the module docstring for one game and population."""

    game: str
    payoff_unit: str
    nash_iterations: int
    population: dict[str, float]
    seats: list[GameSeatValues]

    def to_dict(self) -> dict:
        return asdict(self)


def _population(game: str, population: Population | Mapping[str, float]):
    """The canonical game, its OpenSpiel name, and the population's specs and weights.

    Raises:
        ValueError: An opponent of another game.
    """
    name = canonical_game(game)
    rules = game_rules(name)
    if not isinstance(population, Population):
        population = Population(tuple(population.items()))
    specs = population.specs
    for spec in specs:
        if canonical_game(spec.split(":")[0]) != name:
            raise ValueError(f"{spec!r} is not an opponent of {name}")
    return name, rules, specs, [float(w) for w in population.weights]


def exploitation_values(
    game: str, population: Population | Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    """Steps 3-5 for both agent seats, without the Nash interval (no CFR+ run):
    ``{seat: {"best_response": {spec: value}, "best_fixed": ..., "ceiling": ...}}``.

    Raises:
        ValueError: An opponent of another game, or a randomised one without exact
            action probabilities.
    """
    _, rules, specs, weights = _population(game, population)
    game_name = rules.game_name
    out = {}
    for agent_seat, label in ((0, "first"), (1, "second")):
        opp_seat = 1 - agent_seat
        tables = [opponent_table(game_name, s, opp_seat) for s in specs]
        mixed = mixture_table(game_name, tables, weights, opp_seat)
        *values, best_fixed = best_response_values(game_name, [*tables, mixed], agent_seat)
        br = dict(zip(specs, values, strict=True))
        out[label] = {
            "best_response": br,
            "best_fixed": best_fixed,
            "ceiling": sum(w * br[s] for s, w in zip(specs, weights, strict=True)),
        }
    return out


def game_oracle(
    game: str,
    population: Population | Mapping[str, float],
    nash_iterations: int | None = None,
) -> GameOracle:
    """Compute the reference values of ``game`` (any registered two-player OpenSpiel
    game) for a population of its opponents.

    Raises:
        ValueError: An opponent of another game, or a randomised one without exact
            action probabilities.
    """
    name, rules, specs, weights = _population(game, population)
    iterations = nash_iterations or NASH_ITERATIONS.get(rules.game_name, 200)
    low, high = nash_bounds(rules.game_name, iterations)
    seats = []
    for label, values in exploitation_values(name, population).items():
        lo, hi = (low, high) if label == "first" else (-high, -low)
        seats.append(
            GameSeatValues(seat=label, nash=(lo + hi) / 2, nash_low=lo, nash_high=hi, **values)
        )
    return GameOracle(
        game=name,
        payoff_unit=rules.payoff_unit,
        nash_iterations=iterations,
        population={canonical_spec(s): w for s, w in zip(specs, weights, strict=True)},
        seats=seats,
    )
