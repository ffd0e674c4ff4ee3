"""``mage oracle showdown``: what each objective and each credit mode plays, exactly."""

from __future__ import annotations

import json
from typing import Any

from rich.table import Table

from mage_rl.envs import Population
from mage_rl.envs.showdown import GAME
from mage_rl.envs.showdown_values import ShowdownValues, showdown_values

_OBJECTIVE_NAMES = {
    "final": "last episode (MAGE's objective)",
    "sum": "sum of episodes (cumulative)",
    "greedy": "each episode alone (greedy with memory)",
}
_CREDIT_NAMES = {
    "differential": "differential (MAGE)",
    "cumulative": "cumulative",
    "single_episode": "single_episode",
}


def print_showdown_oracle(
    population_text: str | None,
    *,
    episodes: int,
    gamma_traj: float,
    omega: float,
    as_json: bool,
    console: Any,
) -> int:
    """Print :func:`~mage_rl.envs.showdown_values.showdown_values` as tables or JSON.

    Raises:
        SystemExit: A bad population, K or discount, with the reason.
    """
    try:
        population = Population.parse(population_text or "showdown_train", game=GAME)
        weights = dict(zip(population.specs, population.weights, strict=True))
        values = showdown_values(weights, episodes, gamma_traj=gamma_traj, omega=omega)
    except ValueError as exc:
        raise SystemExit(f"mage oracle showdown: {exc}") from None
    if as_json:
        print(json.dumps(values.to_dict(), indent=2))
        return 0
    _print_tables(values, console)
    return 0


def _print_tables(values: ShowdownValues, console: Any) -> None:
    pop = ", ".join(f"{s.split(':', 1)[1]}={w:.2f}" for s, w in values.population.items())
    k = values.episodes
    for title, plans, names in (
        (f"Showdown, K = {k}: the Bayes-optimal plan of each objective ({pop})",
         values.objectives, _OBJECTIVE_NAMES),
        (f"What the learner's credit settles on (GiGPO, gamma_traj {values.gamma_traj:g}, "
         f"omega {values.omega:g})", values.credit, _CREDIT_NAMES),
    ):  # fmt: skip
        table = Table(title=title)
        table.add_column("maximises")
        table.add_column("first answer")
        table.add_column("margin", justify="right")
        table.add_column("probes in episode", justify="right")
        for i in range(k):
            table.add_column(f"episode {i + 1}", justify="right")
        table.add_column("sum", justify="right")
        for name, plan in plans.items():
            table.add_row(
                names[name], plan.first_answer, f"{plan.first_margin:+.4f}",
                "never" if plan.probe_episode is None else str(plan.probe_episode),
                *(f"{v:+.4f}" for v in plan.episode_values), f"{plan.total:+.4f}",
            )  # fmt: skip
        console.print(table)
    console.print(
        f"Chips per episode. A blind call is worth {values.call_prior:+.4f}; the best fixed "
        f"policy (the same answer every episode, whatever it saw) earns {values.best_fixed:+.4f}; "
        f"knowing the opponent earns {values.ceiling:+.4f}. margin: the first decision's own "
        "objective, CALL minus FOLD (ties fold). The credit modes' plans are where "
        "policy-gradient learning with those advantages can settle: each episode's answer "
        "climbs its own episode's result plus omega times its step-wise return."
    )
