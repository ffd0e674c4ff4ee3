"""The report of a training run: what it learned, against its untrained self and the oracle.

``mage train`` writes it after the final evaluation, from the files the run already has:

- ``eval/untrained.json`` and ``eval/BASELINE.json`` (:mod:`mage_rl.eval.training`), and
  the final ``eval/iter_NNNNNN.json``: one row each, on the same tasks;
- ``metrics.jsonl``: the training batches' ev@K (or success@K) per iteration;
- the exact oracle values for the run's population (SPEC §9; Kuhn Poker, Leduc Hold'em and
  Liar's Dice): the best fixed strategy and the ceiling per seat, and for Kuhn Poker the
  Bayes value of the last hand after K-1 hands.

It writes ``report.md`` (tables, the verdict on the last episode, provenance) and
``learning_curve.png`` into the run folder, and ``report.json`` with the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mage_rl.envs import game_rules
from mage_rl.envs.rps_values import rps_values
from mage_rl.envs.showdown_values import showdown_values
from mage_rl.eval.bayes import bayes_last_hand
from mage_rl.eval.decisions import (
    counts_by_episode,
    decisions_table,
    episodes_table,
    small_game_counts,
)
from mage_rl.eval.game_oracles import exploitation_values
from mage_rl.eval.oracles import kuhn_oracle
from mage_rl.eval.report_exploitability import exploitability_lines, first_episode_exploitability
from mage_rl.eval.rps_families import family_table, rps_families
from mage_rl.eval.stats import error_bar
from mage_rl.eval.training import UNTRAINED, baseline_labels
from mage_rl.eval.verdicts import (
    fmt_payoff,
    paired_verdicts,
    seat_weights,
    verdict_lines,
    verdicts,
)
from mage_rl.fileio import atomic_write_text
from mage_rl.players.play_settings import run_config
from mage_rl.provenance import write_results
from mage_rl.train_folder import checkpoint_name

SEATS = ("first", "second")


def _rate(est: dict[str, Any]) -> str:
    return f"{est['mean']:.2f} [{est['low']:.2f}, {est['high']:.2f}]"


ORACLE_COMMANDS = {
    "kuhn_poker": "kuhn",
    "leduc_poker": "leduc",
    "liars_dice": "liars_dice",
    "rock_paper_scissors": "rps",
    "showdown": "showdown",
}
"""The games with exact reference values, and the ``mage oracle`` argument of each."""


def oracle_values(cfg: Any) -> dict[str, dict[str, float]] | None:
    """Best fixed and ceiling values per seat for the run's population, in the game's
    payoff (chips; +1/-1 in Liar's Dice), and for Kuhn Poker with fresh deals the Bayes
    value of the last hand. ``None`` for a game without an oracle."""
    if cfg.env.name not in ORACLE_COMMANDS:
        return None
    from mage_rl import runtime

    population = runtime.eval_population(cfg)
    if cfg.env.name == "rock_paper_scissors":
        try:
            weights = dict(zip(population.specs, population.weights, strict=True))
            rps = rps_values(weights, cfg.meta.episodes)
        except ValueError:  # an opponent of a plugin, which the enumeration does not know
            return None
        values = {"best_fixed": rps.best_fixed, "ceiling": rps.ceiling}
        if cfg.meta.episodes >= 2:
            values["bayes_last_hand"] = rps.bayes_last
        return {seat: dict(values) for seat in SEATS}  # the game is the same from each seat
    if cfg.env.name == "showdown":
        weights = dict(zip(population.specs, population.weights, strict=True))
        sd = showdown_values(weights, cfg.meta.episodes)
        values = {"best_fixed": sd.best_fixed, "ceiling": sd.ceiling}
        if cfg.meta.episodes >= 2:  # the Bayes-optimal last episode of the final objective
            values["bayes_last_hand"] = sd.objectives["final"].last
        return {seat: dict(values) for seat in SEATS}
    if cfg.env.name != "kuhn_poker":
        values = exploitation_values(cfg.env.name, population)  # no Nash: not reported
        return {
            seat: {"best_fixed": v["best_fixed"], "ceiling": v["ceiling"]}
            for seat, v in values.items()
        }

    kuhn = kuhn_oracle(population)
    out = {}
    for index, seat in enumerate(kuhn.seats):
        values = {"best_fixed": seat.best_fixed, "ceiling": seat.ceiling}
        if cfg.env.protocol == "fresh" and cfg.meta.episodes >= 2:
            try:
                bayes = bayes_last_hand(population, index, (cfg.meta.episodes,))
                values["bayes_last_hand"] = bayes["adaptive"][cfg.meta.episodes]
            except ValueError:  # a stochastic opponent: no exact enumeration
                pass
        out[seat.seat] = values
    return out


def _last_ev(summary: dict[str, Any], seat: str | None) -> dict[str, Any] | None:
    """The last episode's ev with its interval: stratified when the design is."""
    strat = summary.get("stratified")
    block = strat if seat is None else (strat or {}).get("by_seat", {}).get(seat)
    if strat is not None:
        return block["ev@k"][-1] if block else None
    plain = summary["intervals"] if seat is None else summary["intervals"]["by_seat"].get(seat)
    return plain["ev@k"][-1] if plain and "ev@k" in plain else None


def _agents(run_dir: Path, cfg: Any, final: str, suffix: str) -> list[tuple[str, Path]]:
    """``(row name, file)`` of each agent evaluated in the run: baselines, then trained."""
    named = []
    for label in [*baseline_labels(cfg), final]:
        path = run_dir / "eval" / f"{label}{suffix}"
        if path.exists():
            named.append((f"trained ({label})" if label == final else label, path))
    return named


def _rows(run_dir: Path, cfg: Any, final: str) -> list[tuple[str, dict[str, Any]]]:
    return [(name, json.loads(p.read_text())) for name, p in _agents(run_dir, cfg, final, ".json")]


def _decisions(run_dir: Path, cfg: Any, final: str) -> tuple[list[str], dict[str, Any]]:
    """The tables of what each agent plays at each state and in each episode, and their
    counts for report.json (both empty when the game has too many states for a table)."""
    agents, episodes = [], []
    for name, path in _agents(run_dir, cfg, final, ".jsonl"):
        with path.open() as lines:
            records = [json.loads(x) for x in lines if x.strip()]
        counts = small_game_counts(records)
        if counts is None:  # too many states for a table
            return [], {}
        agents.append((name, counts))
        episodes.append((name, counts_by_episode(records)))
    table = decisions_table(agents)
    if not table:
        return [], {}
    lines = ["", "What each agent answered at each decision state, over every hand of the "
             "evaluation (share of each action, number of answers):", "", *table]  # fmt: skip
    by_episode = episodes_table(episodes)
    if by_episode:
        lines += ["", "The same answers by episode of the meta-episode, over every state "
                  "(does the agent play its last episode as it plays its first?):", "",
                  *by_episode]  # fmt: skip
    doc = {
        "decisions": dict(agents),
        "decisions_by_episode": {n: {str(e): c for e, c in b.items()} for n, b in episodes},
    }
    return lines, doc


def _last_success(summary: dict[str, Any], seat: str | None) -> dict[str, Any] | None:
    """success@K with its interval, for games without a payoff."""
    block = summary["intervals"] if seat is None else summary["intervals"]["by_seat"].get(seat)
    return block["success@k"][-1] if block else None


def _verdict(rows: list[tuple[str, dict[str, Any]]], oracle: dict | None, k: int) -> list[str]:
    named = dict(rows)
    before = named.get(UNTRAINED)
    after = next((s for n, s in rows if n.startswith("trained")), None)
    if before is None or after is None:
        return []
    chips = _last_ev(after, None) is not None
    metric, last, fmt = (
        (f"ev@{k}", _last_ev, fmt_payoff) if chips else (f"success@{k}", _last_success, _rate)
    )
    lines = []
    for seat in (None, *SEATS):
        b, a = last(before, seat), last(after, seat)
        if not a or not b or a.get("low") is None or b.get("high") is None:
            continue
        where = "all seats" if seat is None else f"{seat} seat"
        if a["low"] > b["high"]:
            word = "above the untrained model, 95 % intervals apart"
        elif a["mean"] > b["mean"]:
            word = "above the untrained model, but the 95 % intervals overlap"
        else:
            word = "not above the untrained model"
        target = ""
        if chips and oracle and seat is not None:
            best = oracle[seat]["best_fixed"]
            reach = "reaches" if a["mean"] >= best else "is below"
            target = f"; it {reach} the best fixed strategy ({best:+.4f})"
        lines.append(f"- {metric}, {where}: trained {fmt(a)}, untrained {fmt(b)}: {word}{target}.")
    return lines


def _curve(run_dir: Path, k: int) -> tuple[list[int], list[float], str]:
    """The training batches' ev@K per iteration (success@K for games without chips)."""
    its, values, name = [], [], ""
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        name = name or (f"ev@{k}" if f"charts/ev@{k}" in row else f"success@{k}")
        if f"charts/{name}" in row:
            its.append(int(row["iteration"]))
            values.append(float(row[f"charts/{name}"]))
    return its, values, name or f"ev@{k}"


def _plot(run_dir: Path, rows, oracle, k: int, final_iteration: int) -> Path:
    from matplotlib.figure import Figure

    its, values, metric = _curve(run_dir, k)
    fig = Figure(figsize=(9.5, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    if values:
        window = max(1, min(5, len(values)))
        smooth = [
            sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
            for i in range(len(values))
        ]
        ax.plot(its, values, color="0.75", lw=1, label=f"training batches, {metric}")
        ax.plot(its, smooth, color="C0", lw=2, label=f"moving mean of {window}")
    for i, (name, summary) in enumerate(rows):
        est = _last_ev(summary, None)
        if not est or est.get("mean") is None:
            continue
        x = final_iteration if name.startswith("trained") else 0
        x += 0.15 * (i - (len(rows) - 1) / 2) * max(1, final_iteration) / 10
        below, above = error_bar(est)
        ax.errorbar([x], [est["mean"]], yerr=[[below], [above]], fmt="o", capsize=4, color=f"C{i + 1}",
                    label=f"eval: {name}")  # fmt: skip
    if oracle:
        for seat, style in zip(SEATS, ("--", ":"), strict=True):
            ax.axhline(oracle[seat]["best_fixed"], color="k", ls=style, lw=1,
                       label=f"best fixed, {seat} seat")  # fmt: skip
            if "bayes_last_hand" in oracle[seat]:
                ax.axhline(oracle[seat]["bayes_last_hand"], color="C3", ls=style, lw=1,
                           label=f"Bayes last hand, {seat} seat")  # fmt: skip
    ax.set_xlabel("iteration")
    ax.set_ylabel(metric if metric.startswith("success") else f"chips in episode {k} ({metric})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    out = run_dir / "learning_curve.png"
    fig.savefig(out, dpi=110)
    return out


def _families(run_dir: Path, cfg: Any, final: str) -> dict[str, dict[str, Any]]:
    """Rock-paper-scissors against opponents of several families: each agent's figures
    by family (:func:`~mage_rl.eval.rps_families.rps_families`); empty otherwise."""
    if cfg.env.name != "rock_paper_scissors":
        return {}
    from mage_rl import runtime

    population = runtime.eval_population(cfg)
    try:
        values = rps_values(
            dict(zip(population.specs, population.weights, strict=True)), cfg.meta.episodes
        )
    except ValueError:  # an opponent of a plugin without a model
        return {}
    if len(values.families) < 2:
        return {}
    out = {}
    for name, path in _agents(run_dir, cfg, final, ".jsonl"):
        with path.open() as lines:
            out[name] = rps_families([json.loads(x) for x in lines if x.strip()], values)
    return out


def _cache_lines(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A line naming the rows whose figures came from the evaluation cache, if any."""
    cached = [(name, s["cache"]) for name, s in rows if s.get("cache", {}).get("hit")]
    if not cached:
        return []
    said = "; ".join(
        f"{name} computed on {c.get('computed_at')} in {c.get('computed_seconds', 0):.1f} s "
        f"(key {str(c.get('key'))[:12]})"
        for name, c in cached
    )
    return ["", f"From this machine's evaluation cache (`eval.cache`, docs/training.md): {said}. "
            "`--set eval.cache=false` plays them again."]  # fmt: skip


def write_training_report(
    run_dir: Path,
    cfg: Any,
    final_iteration: int,
    started: float | None = None,
    phases: Any = None,
) -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and ``learning_curve.png``.

    ``started`` (``time.time()`` when the command began) sets the stamp's wall time;
    ``phases`` (the run's :class:`~mage_rl.rl.phases.RunClock`) adds the table of where
    the time went.

    Returns:
        The paths of the report and the plot, and the verdict lines on the last episode.
    """
    k = cfg.meta.episodes
    final = checkpoint_name(final_iteration)
    rows = _rows(run_dir, cfg, final)
    oracle = oracle_values(cfg)
    stratified = any("stratified" in s for _, s in rows)
    lines = [f"# {cfg.env.name}: {cfg.meta.agent} after {final_iteration} iterations", ""]
    n = max((s["n"] for _, s in rows), default=0)
    fewer = [f"{name} played {s['n']} of them" for name, s in rows if s["n"] < n]
    subset = ""
    if fewer:
        which = "the first seeds of every stratum" if stratified else "the first ones"
        subset = f"; {', '.join(fewer)}, {which}"
    lines += [
        f"Evaluation: {n} meta-episodes per agent on the same tasks (seed {cfg.eval.seed}"
        f"{subset})"
        + f", K = {k}, temperature {cfg.eval.temperature}"
        + (", stratified over opponent, seat and (where the game deals) the last deal" if stratified else "")
        + ". Intervals are 95 %."
        + (" A hand abandoned after invalid answers counts 0 chips in the stratified ev@k."
           if stratified else " ev@k leaves out hands abandoned after invalid answers.")
        + " invalid: the share of play answers without a legal action.",
        "",
        "| agent | " + " | ".join(f"success@{i}" for i in range(1, k + 1))
        + " | " + " | ".join(f"ev@{i}" for i in range(1, k + 1)) + " | invalid |",
        "| --- |" + " --- |" * (2 * k + 1),
    ]  # fmt: skip
    for name, summary in rows:
        iv = summary["intervals"]
        evs = (summary.get("stratified") or iv).get("ev@k", [None] * k)
        lines.append(
            f"| {name} | " + " | ".join(_rate(e) for e in iv["success@k"])
            + " | " + " | ".join(fmt_payoff(e) for e in evs)
            + f" | {iv['turns']['invalid_share']:.2f} |"
        )  # fmt: skip
    if any("ev@k" in s["intervals"] for _, s in rows):
        lines += ["", f"ev@{k} by seat:", "", "| agent | first seat | second seat |",
                  "| --- | --- | --- |"]  # fmt: skip
        for name, summary in rows:
            cells = [fmt_payoff(_last_ev(summary, seat)) for seat in SEATS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += _cache_lines(rows)
    decisions, decision_counts = _decisions(run_dir, cfg, final)
    lines += decisions
    if oracle:
        unit = game_rules(cfg.env.name).payoff_unit
        lines += [
            "",
            f"Exact values for this population (`mage oracle {ORACLE_COMMANDS[cfg.env.name]}`), "
            f"{unit}:",
            "",
        ]
        for seat in (s for s in SEATS if s in seat_weights(cfg)):
            v = oracle[seat]
            bayes = (
                f", Bayes last episode after {k - 1} episodes {v['bayes_last_hand']:+.4f}"
                if "bayes_last_hand" in v
                else ""
            )
            lines.append(
                f"- {seat} seat: best fixed {v['best_fixed']:+.4f}, ceiling {v['ceiling']:+.4f}"
                f"{bayes}"
            )
    families = _families(run_dir, cfg, final)
    if families:
        lines += [
            "",
            "By opponent family, wins minus losses per round, with each family's exact "
            "references (`mage oracle rps`; the previous-move rule answers what beats the "
            "opponent's previous move):",
            "",
            *family_table(list(families.items())),
        ]
    base = run_config(run_dir)["policy"]["model"]
    trained = run_dir / "checkpoints" / final / "model"
    exploit = first_episode_exploitability(
        cfg, {UNTRAINED: base, f"trained ({final})": str(trained)}
    )
    if exploit:
        lines += exploitability_lines(exploit)
    verdict = _verdict(rows, oracle, k)
    if verdict:
        lines += ["", "## Last episode, trained against untrained", "", *verdict]
    found = verdicts(rows, oracle, cfg, paired_verdicts(run_dir, cfg, final))
    if found:
        lines += [
            "",
            f"## Does the last episode exploit what the first {k - 1} showed?",
            "",
            f"The trained agent's episode {k} (payoff per episode, all seats), against:",
            "",
            *verdict_lines(found, k),
        ]
    plot = _plot(run_dir, rows, oracle, k, final_iteration)
    if phases is not None:
        lines += ["", "## Where the time went", "", *phases.markdown()]
    doc = {
        "rows": dict(rows),
        "oracle": oracle,
        "verdict": verdict,
        "verdicts": found,
        "exploitability": exploit,
        **({"families": families} if families else {}),
        **decision_counts,
        **({"phases": phases.summary()} if phases is not None else {}),
    }
    write_results(run_dir / "report.json", doc, started=started)
    stamp = doc["provenance"]
    lines += [
        "",
        f"![learning curve]({plot.name})",
        "",
        f"Written by `{stamp['command']}` at commit {stamp.get('commit', '?')}, "
        f"{stamp['cpu_count']} CPUs ({stamp['cpu_model']}), torch threads "
        f"{stamp.get('torch_threads', '?')}, {stamp['wall_seconds']} s.",
    ]
    report = atomic_write_text(run_dir / "report.md", "\n".join(lines) + "\n")
    return {"report": str(report), "plot": str(plot), "verdict": verdict}
