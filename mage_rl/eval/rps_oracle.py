"""``mage oracle rps``: the exact values of rock-paper-scissors for K = 1..5."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from mage_rl.envs import Population
from mage_rl.envs.rps_values import RpsValues, rps_values

MAX_K = 5


def print_rps_oracle(
    population_text: str | None, *, episodes: int = 3, as_json: bool, console: Any
) -> int:
    """Print :func:`~mage_rl.envs.rps_values.rps_values` for K = 1..5 (JSON: a list of
    them), then, for K = ``episodes``, every round and every opponent family.

    Raises:
        SystemExit: ``episodes`` outside 1..5, or an opponent that is not one of the
            game's, with the reason.
    """
    if not 1 <= episodes <= MAX_K:
        raise SystemExit(f"mage oracle rps: --episodes must be 1..{MAX_K}, got {episodes}")
    population = Population.parse(population_text or "rps_train", game="rock_paper_scissors")
    weights = dict(zip(population.specs, population.weights, strict=True))
    try:
        values = [rps_values(weights, k) for k in range(1, MAX_K + 1)]
    except ValueError as exc:
        raise SystemExit(f"mage oracle rps: {exc}") from None
    if as_json:
        print(json.dumps([v.to_dict() for v in values], indent=2))
        return 0
    first = values[0]
    pop = ", ".join(f"{s.split(':', 1)[1]}={w:.3f}" for s, w in first.population.items())
    table = Table(title=f"Rock-paper-scissors exact values, wins minus losses per round ({pop})")
    for name in ("K", "best fixed, last round", "win rate", "Bayes last round", "win rate",
                 "greedy last round", "ceiling (knowing the opponent)"):  # fmt: skip
        table.add_column(name)
    for v in values:
        table.add_row(
            str(v.episodes), f"{v.best_fixed:+.4f}", f"{v.win_best_fixed:.4f}",
            f"{v.bayes_last:+.4f}", f"{v.win_bayes_last:.4f}", f"{v.greedy_by_round[-1]:+.4f}",
            f"{v.ceiling:+.4f}",
        )  # fmt: skip
    console.print(table)
    _details(values[episodes - 1], console)
    console.print(
        "best fixed: the best constant move (the same every round). Bayes round t: the "
        "most round t can earn when the rounds before it are played for it (they may "
        "probe, or set up an opponent that reacts to the agent's moves). greedy: every "
        "round best-responds to what the rounds before showed. ceiling: the Bayes value "
        "of the last round against each opponent known, weighted. previous-move rule: "
        "answer what beats the opponent's previous move (the main job's rule)."
    )
    return 0


def _details(v: RpsValues, console: Any) -> None:
    """Every round of K = ``v.episodes``, and the last round by opponent family."""
    rounds = Table(title=f"K = {v.episodes}, round by round")
    rounds.add_column("value")
    for t in range(v.episodes):
        rounds.add_column(f"round {t + 1}", justify="right")
    rounds.add_row(f"best fixed ({v.best_fixed_move})", *(f"{x:+.4f}" for x in v.fixed_by_round))
    rounds.add_row("Bayes", *(f"{x:+.4f}" for x in v.bayes_by_round))
    rounds.add_row("greedy with memory", *(f"{x:+.4f}" for x in v.greedy_by_round))
    rounds.add_row("previous-move rule", *(f"{x:+.4f}" for x in v.rule_by_round))
    console.print(rounds)
    families = Table(title=f"K = {v.episodes}, the last round by opponent family")
    for name in ("family", "weight", "Bayes play of the population", "ceiling",
                 "previous-move rule"):  # fmt: skip
        families.add_column(name)
    for name, f in v.families.items():
        families.add_row(
            name, f"{f['weight']:.3f}", f"{f['bayes_last']:+.4f}", f"{f['ceiling']:+.4f}",
            f"{f['rule_last']:+.4f}",
        )  # fmt: skip
    console.print(families)
