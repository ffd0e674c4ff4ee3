"""What the main job's target asks for: the best fixed strategy against the training
population, the value of each answer at each decision state, and the exact value of a few
simple strategies a model might learn.

The best fixed strategy is the best response to the population's mixture (one opponent
drawn per hand, then followed). Each answer's value at a state assumes best play after
it, averaged over the opponent's cards with their reach under the mixture. A simple
strategy's value is exact: the game tree walked against each opponent, weighted.

usage: python strategies.py   (a few seconds, no model)
"""

from __future__ import annotations

import pyspiel
from open_spiel.python.algorithms import best_response

from mage_rl.envs.opponents import POPULATION_PRESETS
from mage_rl.eval.oracles import kuhn_game, mixture_policy, opponent_policy

CARDS = "JQK"
# (seat, betting before the answer) in OpenSpiel's history letters, as the prompt says it.
POINTS = {
    (0, ""): "first seat opens",
    (0, "pb"): "first seat, you PASS, opponent BET",
    (1, "p"): "second seat, opponent PASS",
    (1, "b"): "second seat, opponent BET",
}
PASS, BET = 0, 1


def _states(game: pyspiel.Game, seat: int, card: int, history: str):
    """Every full state at this decision, one per opponent card."""
    for other in range(3):
        if other == card:
            continue
        state = game.new_initial_state()
        state.apply_action(card if seat == 0 else other)
        state.apply_action(other if seat == 0 else card)
        for letter in history:
            state.apply_action(PASS if letter == "p" else BET)
        yield state


def answer_values(population) -> dict[tuple[int, str, int], tuple[float, float, float]]:
    """(seat, history, card) -> (value of BET, value of PASS, reach), best play after."""
    game = kuhn_game()
    out = {}
    for seat in (0, 1):
        opp = 1 - seat
        policies = [opponent_policy(spec, opp) for spec in population.specs]
        mixed = mixture_policy(policies, list(population.weights), opp)
        br = best_response.BestResponsePolicy(game, seat, mixed)
        for point_seat, history in POINTS:
            if point_seat != seat:
                continue
            for card in range(3):
                values = [0.0, 0.0]
                reach_sum = 0.0
                for state in _states(game, seat, card, history):
                    reach = 1.0
                    probe = game.new_initial_state()
                    probe.apply_action(state.history()[0])
                    probe.apply_action(state.history()[1])
                    for action in state.history()[2:]:
                        if probe.current_player() == opp:
                            reach *= mixed.action_probabilities(probe)[action]
                        probe.apply_action(action)
                    for action in (PASS, BET):
                        values[action] += reach * br.q_value(state, action)
                    reach_sum += reach
                out[(seat, history, card)] = (
                    values[BET] / reach_sum,
                    values[PASS] / reach_sum,
                    reach_sum / 2,
                )
    return out


def strategy_value(population, p_bet: dict[tuple[int, str, int], float], seat: int) -> float:
    """Exact chips per hand of a strategy given as P(BET) per (seat, history, card)."""
    game = kuhn_game()
    total = 0.0
    for spec, weight in zip(population.specs, population.weights, strict=True):
        opponent = opponent_policy(spec, 1 - seat)

        def walk(state: pyspiel.State, opponent=opponent) -> float:
            if state.is_terminal():
                return state.returns()[seat]
            if state.is_chance_node():
                return sum(p * walk(state.child(a)) for a, p in state.chance_outcomes())
            if state.current_player() != seat:
                probs = opponent.action_probabilities(state)
                return sum(p * walk(state.child(a)) for a, p in probs.items() if p > 0)
            card = state.history()[seat]
            history = "".join("pb"[a] for a in state.history()[2:])
            bet = p_bet[(seat, history, card)]
            value = 0.0
            for action, p in ((BET, bet), (PASS, 1.0 - bet)):
                if p > 0:
                    value += p * walk(state.child(action))
            return value

        total += float(weight) * walk(game.new_initial_state())
    return total


def _rule(open_: str, call_first: str, after_pass: str, call_second: str):
    """P(BET) from four strings of three 0/1 digits (J, Q, K) per decision point."""
    table = {}
    for (seat, history), digits in zip(
        POINTS, (open_, call_first, after_pass, call_second), strict=True
    ):
        for card, digit in enumerate(digits):
            table[(seat, history, card)] = float(digit)
    return table


SIMPLE = {
    "bet and call at every card (what the main job learns)": _rule("111", "111", "111", "111"),
    "bet and call with K only, pass and fold J and Q": _rule("001", "001", "001", "001"),
    "the same, plus call with Q": _rule("001", "011", "001", "011"),
    "call with K only, pass everywhere else": _rule("000", "001", "000", "001"),
    "bet and call everything, but fold J to a bet": _rule("111", "011", "111", "011"),
    "the best fixed strategy, but no bet with J after a pass": _rule("100", "001", "000", "001"),
    "the best fixed strategy": None,
}


def main() -> None:
    population = POPULATION_PRESETS["kuhn_train"]
    weights = {s: float(w) for s, w in zip(population.specs, population.weights, strict=True)}
    print("population kuhn_train:", weights)
    values = answer_values(population)
    best = {key: float(bet > pas) for key, (bet, pas, _) in values.items()}
    print("\nvalue of each answer with best play after it (chips), and the best fixed answer:")
    print(f"{'decision':38s} card   BET     PASS    gap    reach  best")
    print("(reach: the chance that the opponent's answers lead to the state, given the card)")
    for (seat, history), name in POINTS.items():
        for card in range(3):
            bet, pas, reach = values[(seat, history, card)]
            answer = "BET" if best[(seat, history, card)] else "PASS"
            print(f"{name:38s} {CARDS[card]}   {bet:+.3f}  {pas:+.3f}  {abs(bet - pas):.3f}  "
                  f"{reach:.2f}   {answer}")  # fmt: skip
    print("\nexact value of simple strategies (chips per hand):")
    for name, rule in SIMPLE.items():
        rule = rule or best
        first, second = strategy_value(population, rule, 0), strategy_value(population, rule, 1)
        print(f"  {name:55s} first {first:+.4f}  second {second:+.4f}  "
              f"mean {(first + second) / 2:+.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
