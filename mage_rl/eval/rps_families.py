"""Rock-paper-scissors results split by opponent family, with each family's exact
references: what a run's evaluation shows against habits, reactive opponents, cycles,
biased mixes and the held-out outcome family separately."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mage_rl.envs.rps import family_of
from mage_rl.envs.rps_values import RpsValues, rps_values
from mage_rl.eval.stats import bounded, mean_interval
from mage_rl.eval.verdicts import fmt_payoff


def rps_families(records: Sequence[dict[str, Any]], values: RpsValues) -> dict[str, dict[str, Any]]:
    """Per opponent family of the records (:data:`~mage_rl.envs.rps.FAMILIES`; ``other``
    for opponents outside them): the first and the last round with 95 % intervals, the
    last minus the first paired, each opponent's last round, and the exact references:
    the best constant move, the population's Bayes play of the last round against this
    family (not knowing it), the family's own Bayes last round (knowing the family, not
    which of its opponents) and the previous-move rule's last round
    (:func:`~mage_rl.envs.rps_values.previous_move_rule`).

    Only meta-episodes that played all K rounds count."""
    k = values.episodes
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if len(record["episodes"]) == k:
            groups.setdefault(family_of(record["opponent"]) or "other", []).append(record)
    out = {}
    for family, group in groups.items():
        specs = sorted({r["opponent"] for r in group})
        alone = rps_values(dict.fromkeys(specs, 1.0), k)
        payoffs = [[float(e.get("payoff") or 0.0) for e in r["episodes"]] for r in group]
        by_opponent = {
            spec: [p[-1] for p, r in zip(payoffs, group, strict=True) if r["opponent"] == spec]
            for spec in specs
        }
        out[family] = {
            "n": len(group),
            "first": _rate([p[0] for p in payoffs]),
            "last": _rate([p[-1] for p in payoffs]),
            "last_minus_first": bounded(
                mean_interval([p[-1] - p[0] for p in payoffs]), -2.0, 2.0
            ).to_dict(),
            "best_fixed": alone.best_fixed,
            "bayes_last_population": values.families.get(family, {}).get("bayes_last"),
            "bayes_last_family": alone.bayes_last,
            "rule_last": alone.rule_by_round[-1],
            "last_by_opponent": {spec: _rate(last) for spec, last in by_opponent.items()},
        }
    return out


def _rate(payoffs: Sequence[float]) -> dict[str, Any]:
    return bounded(mean_interval(list(payoffs)), -1.0, 1.0).to_dict()


def family_table(agents: Sequence[tuple[str, dict[str, dict[str, Any]]]]) -> list[str]:
    """Markdown lines: one row per agent and family of :func:`rps_families`, with the
    exact references, then each opponent's last round."""
    lines = [
        "| family | agent | n | first round | last round | last minus first (paired) | "
        "best fixed | Bayes last (population) | Bayes last (family known) | previous-move rule |",
        "| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    families = list(dict.fromkeys(name for _, fams in agents for name in fams))
    for family in families:
        for agent, fams in agents:
            f = fams.get(family)
            if f is None:
                continue
            population = f["bayes_last_population"]
            lines.append(
                f"| {family} | {agent} | {f['n']} | {fmt_payoff(f['first'])} | "
                f"{fmt_payoff(f['last'])} | {fmt_payoff(f['last_minus_first'])} | "
                f"{f['best_fixed']:+.3f} | {'–' if population is None else f'{population:+.3f}'} | "
                f"{f['bayes_last_family']:+.3f} | {f['rule_last']:+.3f} |"
            )
    lines.append("")
    for agent, fams in agents:
        lines.append(
            f"The last round by opponent, {agent}: "
            + "; ".join(
                f"{spec.rpartition(':')[2]} {fmt_payoff(est)} (n {est['n']})"
                for f in fams.values()
                for spec, est in f["last_by_opponent"].items()
            )
            + "."
        )
    return lines
