"""``mage oracle rps``: the exact values of rock-paper-scissors for K = 1..5."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from mage_rl.envs import Population
from mage_rl.envs.rps import rps_values


def print_rps_oracle(population_text: str | None, *, as_json: bool, console: Any) -> int:
    """Print :func:`~mage_rl.envs.rps.rps_values` for K = 1..5 as a table or JSON.

    Raises:
        SystemExit: An opponent without exact values (one that changes from round to
            round), with the reason.
    """
    population = Population.parse(population_text or "rps_train", game="rock_paper_scissors")
    weights = dict(zip(population.specs, population.weights, strict=True))
    try:
        values = [rps_values(weights, k) for k in range(1, 6)]
    except ValueError as exc:
        raise SystemExit(f"mage oracle rps: {exc}") from None
    if as_json:
        print(json.dumps([v.to_dict() for v in values], indent=2))
        return 0
    first = values[0]
    pop = ", ".join(f"{s.split(':', 1)[1]}={w:.2f}" for s, w in first.population.items())
    table = Table(title=f"Rock-paper-scissors exact values, wins minus losses per round ({pop})")
    table.add_column("K")
    table.add_column("best fixed (any round, no memory)")
    table.add_column("win rate")
    table.add_column("Bayes last round")
    table.add_column("win rate")
    table.add_column("ceiling (knowing the opponent)")
    for v in values:
        table.add_row(
            str(v.episodes), f"{v.best_fixed:+.4f}", f"{v.win_best_fixed:.4f}",
            f"{v.bayes_last:+.4f}", f"{v.win_bayes_last:.4f}", f"{v.ceiling:+.4f}",
        )  # fmt: skip
    console.print(table)
    console.print(
        "Bayes last round: the best answer to the posterior over the opponents after the "
        "first K-1 rounds (the opponents ignore the agent's moves, so what it played "
        "before does not matter)."
    )
    return 0
