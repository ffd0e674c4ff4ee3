"""Exact reference values for Kuhn Poker against fixed opponents (SPEC §9).

Every value is in chips per hand for the agent, computed with OpenSpiel:

1. Each opponent becomes a tabular policy by asking it for its action at one state of
   every information set it owns (the opponents are deterministic functions of their
   information set).
2. The Nash value per seat is the value of the analytic equilibrium (the alpha = 0
   member of Kuhn's equilibrium family); its NashConv is checked to be zero in tests.
3. Best response to one opponent: OpenSpiel's ``BestResponsePolicy`` value.
4. Best *fixed* strategy against a weighted population: the agent does not know which
   opponent it faces, so it best-responds to the population's behaviour strategy. By
   Kuhn's theorem a mixture of pure strategies equals the behaviour strategy that plays
   ``a`` at information set ``I`` with probability
   ``sum_i w_i r_i(I) pi_i(a|I) / sum_i w_i r_i(I)``, ``r_i(I)`` being opponent i's own
   reach probability of ``I``.
5. The opponent-aware ceiling: ``sum_i w_i BR(pi_i)``, what an agent that knew its
   opponent would earn.
6. Same-deal winnable fraction (the ``replay`` protocol): over the six deals and the
   population, the weight of (deal, opponent) pairs where some line of play wins chips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import pyspiel
from open_spiel.python import policy as os_policy
from open_spiel.python.algorithms import best_response, expected_game_score

from mage_rl.envs.openspiel_env import decision_states
from mage_rl.envs.opponents import Opponent, Population, canonical_spec, make_opponent

KUHN = "kuhn_poker"


def kuhn_game() -> pyspiel.Game:
    """The OpenSpiel Kuhn Poker game."""
    return pyspiel.load_game(KUHN)


def opponent_policy(opponent: Opponent | str, seat: int) -> os_policy.TabularPolicy:
    """A tabular policy that plays ``opponent`` in ``seat`` (uniform in the other seat,
    which best-response computations ignore)."""
    if isinstance(opponent, str):
        opponent = make_opponent(opponent)
    game = kuhn_game()
    table = os_policy.TabularPolicy(game)
    exact = getattr(opponent, "action_probabilities", None)  # a randomised opponent's
    for state in decision_states(game):
        if state.current_player() != seat:
            continue
        probs = table.policy_for_key(state.information_state_string(seat))
        probs[:] = 0.0
        if exact is not None:
            for action, p in exact(state.clone(), seat).items():
                probs[action] = p
            continue
        opponent.reset(0)
        probs[opponent.act(state.clone(), seat)] = 1.0
    return table


def mixture_policy(
    policies: Sequence[os_policy.TabularPolicy], weights: Sequence[float], seat: int
) -> os_policy.TabularPolicy:
    """The behaviour strategy equal to picking policy i with probability ``w_i`` once per
    hand and then following it (step 4 of the module docstring)."""
    game = kuhn_game()
    mixed = os_policy.TabularPolicy(game)
    numer: dict[str, list[float]] = {}
    denom: dict[str, float] = {}

    def walk(state: pyspiel.State, reach: list[float]) -> None:
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action), reach)
            return
        player = state.current_player()
        if player != seat:
            for action in state.legal_actions():
                walk(state.child(action), reach)
            return
        key = state.information_state_string(seat)
        dists = [p.policy_for_key(key) for p in policies]
        if key not in numer:
            numer[key] = [0.0] * game.num_distinct_actions()
            denom[key] = 0.0
            for w, r, dist in zip(weights, reach, dists, strict=True):
                denom[key] += w * r
                for a in state.legal_actions():
                    numer[key][a] += w * r * dist[a]
        for action in state.legal_actions():
            walk(state.child(action), [r * d[action] for r, d in zip(reach, dists, strict=True)])

    walk(game.new_initial_state(), [1.0] * len(policies))
    for key, total in denom.items():
        if total > 0:
            mixed.policy_for_key(key)[:] = [n / total for n in numer[key]]
    return mixed


def best_response_value(opponent: os_policy.TabularPolicy, agent_seat: int) -> float:
    """Chips per hand a best response in ``agent_seat`` earns against ``opponent``."""
    game = kuhn_game()
    br = best_response.BestResponsePolicy(game, agent_seat, opponent)
    return float(br.value(game.new_initial_state()))


def nash_policy(alpha: float = 0.0) -> os_policy.TabularPolicy:
    """Kuhn Poker's analytic equilibrium (both seats), ``alpha`` in [0, 1/3].

    Player 1 bets J with probability alpha, bets K with 3 alpha, checks Q; after a check
    and a bet it calls with Q with probability alpha + 1/3 and always with K. Player 2
    bets K and bets J with probability 1/3 after a check; facing a bet it calls with Q
    with probability 1/3 and always with K.
    """
    if not 0 <= alpha <= 1 / 3:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    bet = {  # information state -> probability of BET
        "0": alpha, "1": 0.0, "2": 3 * alpha,
        "0pb": 0.0, "1pb": alpha + 1 / 3, "2pb": 1.0,
        "0p": 1 / 3, "1p": 0.0, "2p": 1.0,
        "0b": 0.0, "1b": 1 / 3, "2b": 1.0,
    }  # fmt: skip
    table = os_policy.TabularPolicy(kuhn_game())
    for key, p in bet.items():
        table.policy_for_key(key)[:] = [1 - p, p]
    return table


def nash_values() -> tuple[float, float]:
    """The game value for each seat under the equilibrium: (-1/18, +1/18)."""
    game = kuhn_game()
    pol = nash_policy()
    values = expected_game_score.policy_value(game.new_initial_state(), [pol, pol])
    return float(values[0]), float(values[1])


def winnable_fraction(opponent: Opponent | str, agent_seat: int) -> float:
    """Share of the six deals in which some line of play wins chips from ``opponent``
    (the ``replay`` protocol repeats one deal, so this bounds success@K)."""
    if isinstance(opponent, str):
        opponent = make_opponent(opponent)
    game = kuhn_game()
    exact = getattr(opponent, "action_probabilities", None)

    def can_win(state: pyspiel.State) -> bool:
        if state.is_terminal():
            return state.returns()[agent_seat] > 0
        player = state.current_player()
        if player == agent_seat:
            return any(can_win(state.child(a)) for a in state.legal_actions())
        if exact is not None:  # a randomised opponent: any move it may make
            moves = [a for a, p in exact(state.clone(), player).items() if p > 0]
            return any(can_win(state.child(a)) for a in moves)
        return can_win(state.child(opponent.act(state, player)))

    root = game.new_initial_state()
    wins = total = 0
    for c0, _ in root.chance_outcomes():
        dealt = root.child(c0)
        for c1, _ in dealt.chance_outcomes():
            total += 1
            wins += can_win(dealt.child(c1))
    return wins / total


@dataclass
class SeatValues:
    """Reference values for one agent seat, chips per hand."""

    seat: str
    nash: float
    best_response: dict[str, float]
    best_fixed: float
    ceiling: float
    replay_winnable: float


@dataclass
class KuhnOracle:
    """Every SPEC §9 value for one population."""

    population: dict[str, float]
    seats: list[SeatValues]

    def to_dict(self) -> dict:
        return asdict(self)


def kuhn_oracle(population: Population | Mapping[str, float]) -> KuhnOracle:
    """Compute the SPEC §9 table for a population of Kuhn opponents."""
    if not isinstance(population, Population):
        population = Population(tuple(population.items()))
    specs = population.specs
    for spec in specs:
        if not spec.startswith(f"{KUHN}:"):
            raise ValueError(f"{spec!r} is not a Kuhn Poker opponent")
    weights = [float(w) for w in population.weights]
    nash = nash_values()
    seats = []
    for agent_seat, label in ((0, "first"), (1, "second")):
        opp_seat = 1 - agent_seat
        policies = [opponent_policy(s, opp_seat) for s in specs]
        br = {s: best_response_value(p, agent_seat) for s, p in zip(specs, policies, strict=True)}
        mixed = mixture_policy(policies, weights, opp_seat)
        seats.append(
            SeatValues(
                seat=label,
                nash=nash[agent_seat],
                best_response=br,
                best_fixed=best_response_value(mixed, agent_seat),
                ceiling=sum(w * br[s] for s, w in zip(specs, weights, strict=True)),
                replay_winnable=sum(
                    w * winnable_fraction(s, agent_seat)
                    for s, w in zip(specs, weights, strict=True)
                ),
            )
        )
    pop = {canonical_spec(s): w for s, w in zip(specs, weights, strict=True)}
    return KuhnOracle(population=pop, seats=seats)
