"""``mage bench learning``: the probe suite every change to the learner is judged on.

Three small games, one set of learner settings, exact reference values for each:

- ``rps``: rock-paper-scissors against ``rps_train`` (always rock, paper or scissors),
  K = 3 rounds. Round 1 cannot be won more than 1 time in 3 by any policy; after one
  round the opponent is known, so Bayes play wins every later round. Reported: the win
  rate and payoff by round, and how often rounds 2..K answer the move that beats what
  the opponent played the round before.
- ``kuhn_card``: Kuhn Poker, single hands (K = 1) in the first seat against
  ``kuhn:aggressive``. Nothing to identify; the question is whether the answer depends on
  the card. Reported: the share of BET by card at the opening decision and facing a bet,
  and the value against the exact best response to that opponent.
- ``kuhn_k3``: Kuhn Poker against ``kuhn_train``, K = 3 fresh hands, both seats. Reported:
  the value by hand against the exact best fixed strategy and the Bayes value of the
  last hand (SPEC §9).
- ``showdown``: the showdown against ``showdown_train`` (a bluffer and an honest bettor),
  K = 2, where information has a price (SPEC §11): only a call, worth -0.25 blind, shows
  the opponent's hand. Reported: the share of first episodes that call, the last
  episode's calls after a weak hand, a strong one or nothing shown, and the value by
  episode against the exact optimum of the last episode (+0.5) and the best fixed (0).
  With the suite's settings it asks whether the learner pays for information; how the
  settings bear on that (``advantages.omega``) is in docs/algorithm.md section 7.

Every probe trains the same learner settings (``--config``: the ``policy``, ``rollout``,
``returns``, ``advantages`` and ``learner`` sections of a training config; the probe sets
``env``, ``meta.episodes``, ``eval`` and ``train``), with ``mage train``'s own trainer,
evaluates the model before and after on fixed tasks, and writes its run folder under
``--out`` beside ``learning.json`` and ``learning.md``.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mage_rl.envs.parsing import extract_action
from mage_rl.eval.ablation import PROBES as CALLED
from mage_rl.eval.ablation import SITUATIONS, run_summary
from mage_rl.eval.stats import wilson_interval
from mage_rl.provenance import write_results

SHARED_SECTIONS = ("plugins", "policy", "rollout", "returns", "advantages", "learner")
"""What a probe takes from ``--config``: everything that says how the model learns."""


@dataclass(frozen=True)
class Probe:
    """One game of the suite.

    Attributes:
        name: Its name on the command line.
        env: The ``env`` section.
        episodes: K.
        iterations: Training iterations (``--iterations`` overrides every probe's).
        eval_tasks: Evaluation meta-episodes (the same fixed tasks before and after).
        stratify: Stratified evaluation (two-player poker: opponent, seat, last deal).
        question: What the probe asks, for the table.
    """

    name: str
    env: dict[str, Any]
    episodes: int
    iterations: int
    eval_tasks: int
    stratify: bool
    question: str


PROBES = {
    "rps": Probe(
        "rps",
        {
            "name": "rock_paper_scissors",
            "population": "rps_train",
            "seat": "first",
            "protocol": "fresh",
        },  # fmt: skip
        episodes=3,
        iterations=20,
        eval_tasks=60,
        stratify=False,
        question="does it beat, in rounds 2-3, the move the opponent has shown?",
    ),
    "kuhn_card": Probe(
        "kuhn_card",
        {
            "name": "kuhn_poker",
            "population": "kuhn:aggressive",
            "seat": "first",
            "protocol": "fresh",
        },  # fmt: skip
        episodes=1,
        iterations=10,
        eval_tasks=60,
        stratify=True,
        question="does its answer depend on its card?",
    ),
    "kuhn_k3": Probe(
        "kuhn_k3",
        {
            "name": "kuhn_poker",
            "population": "kuhn_train",
            "seat": "sampled",
            "protocol": "fresh",
        },  # fmt: skip
        episodes=3,
        iterations=10,
        eval_tasks=72,
        stratify=True,
        question="does its last hand beat the best fixed strategy?",
    ),
    "showdown": Probe(
        "showdown",
        {"name": "showdown", "population": "showdown_train", "seat": "second", "protocol": "fresh"},
        episodes=2,
        iterations=20,
        eval_tasks=100,
        stratify=True,
        question="does it call first to see the hand, and then call only the bluffer?",
    ),
}

MOVES = ("ROCK", "PAPER", "SCISSORS")
CARD_PATTERN = re.compile(r"card: ([JQK])")
"""The agent's card in a Kuhn Poker observation."""


def probe_config(probe: Probe, base: dict[str, Any], seed: int, iterations: int) -> dict[str, Any]:
    """The training config of one probe: ``base``'s learner settings, the probe's game."""
    cfg = {key: base[key] for key in SHARED_SECTIONS if key in base}
    cfg.setdefault("policy", {})
    cfg["env"] = dict(probe.env)
    meta = dict(base.get("meta") or {})
    meta["episodes"] = probe.episodes
    cfg["meta"] = meta
    rollout = dict(cfg.get("rollout") or {})
    rollout["seed"] = seed
    cfg["rollout"] = rollout
    learner = dict(cfg.get("learner") or {})
    learner["seed"] = seed
    cfg["learner"] = learner
    cfg["eval"] = {
        "every": 0,
        "tasks": probe.eval_tasks,
        "stratify": probe.stratify,
        "before": True,
        "baselines": [],
    }
    cfg["train"] = {"iterations": iterations}
    return cfg


def _answer(turn: dict[str, Any]) -> str | None:
    """The action a play turn answered, upper-cased; ``None`` when it was invalid."""
    found = extract_action(turn.get("text") or "")
    return found.strip().upper() if found and not turn.get("invalid") else None


def read_records(path: Path) -> list[dict[str, Any]]:
    with path.open() as lines:
        return [json.loads(x) for x in lines if x.strip()]


def share_interval(hits: int, n: int) -> dict[str, float | int | None]:
    """A share with its 95 % Wilson interval."""
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n": 0}
    est = wilson_interval(hits, n)
    return {"mean": hits / n, "low": est.low, "high": est.high, "n": n}


def win_by_episode(records: Sequence[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The share of episodes won at each index ``0..k-1``, with its Wilson interval."""
    wins, played = [0] * k, [0] * k
    for record in records:
        for episode in record["episodes"]:
            played[episode["index"]] += 1
            wins[episode["index"]] += episode["outcome"] == "won"
    return [share_interval(w, n) for w, n in zip(wins, played, strict=True)]


def rps_beats_last_shown(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How often answers in rounds 2..K beat the opponent's previous move."""
    return share_interval(*_rps_reads(records))


def rps_figures(records: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """Win rate by round, and how often rounds 2..K beat the opponent's previous move."""
    return {
        "win_by_round": win_by_episode(records, k),
        "beats_last_shown": rps_beats_last_shown(records),
    }


def _opponent_move(record: dict[str, Any], index: int) -> str | None:
    """The opponent's move in round ``index``, from the agent's answer and the outcome."""
    for turn in record["turns"]:
        if turn["kind"] != "play" or turn["episode"] != index:
            continue
        answer = _answer(turn)
        if answer is None:
            return None
        outcome = record["episodes"][index]["outcome"]
        mine = MOVES.index(answer)
        theirs = {"draw": mine, "won": (mine - 1) % 3, "lost": (mine + 1) % 3}.get(outcome)
        return MOVES[theirs] if theirs is not None else None
    return None


def _rps_reads(records: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """Answers in rounds 2..K that beat the opponent's previous move, and all of them."""
    reads = informed = 0
    for record in records:
        for turn in record["turns"]:
            if turn["kind"] != "play" or turn["episode"] == 0:
                continue
            before = _opponent_move(record, turn["episode"] - 1)
            if before is None:
                continue
            informed += 1
            reads += _answer(turn) == MOVES[(MOVES.index(before) + 1) % 3]
    return reads, informed


def kuhn_card_figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The share of BET by card, at the opening decision and facing a bet."""
    counts: dict[tuple[str, str], Counter[str]] = {}
    for record in records:
        for turn in record["turns"]:
            if turn["kind"] != "play":
                continue
            card = CARD_PATTERN.search(turn.get("anchor") or "")
            if not card:
                continue
            spot = "facing a bet" if "No bet to face" not in turn["anchor"] else "no bet to face"
            counts.setdefault((spot, card.group(1)), Counter())[_answer(turn) or "invalid"] += 1
    out: dict[str, dict[str, Any]] = {}
    for (spot, card), c in sorted(counts.items()):
        out.setdefault(spot, {})[card] = share_interval(c["BET"], sum(c.values()))
    spread = {
        spot: max(v["mean"] for v in cards.values()) - min(v["mean"] for v in cards.values())
        for spot, cards in out.items()
        if len(cards) > 1
    }
    return {"bet_share": out, "bet_spread_over_cards": spread}


def showdown_figures(records: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """The share of first episodes that call (the probe), and of last episodes that call
    after what the earlier calls showed (a weak hand, only strong ones, nothing)."""
    episodes = {(r["opponent"], r["seed"], r["seat"]): r["episodes"] for r in records}
    found = run_summary(episodes, k, (None, None), CALLED["showdown"], SITUATIONS["showdown"])
    return {
        "first_call_share": found["first_probe_share"],
        "last_call_share_by_situation": found["last_probe_share_by_situation"],
    }


FIGURES: dict[str, Callable[[Sequence[dict[str, Any]], int], dict[str, Any]]] = {
    "rps": rps_figures,
    "showdown": showdown_figures,
    "kuhn_card": lambda records, k: kuhn_card_figures(records),
    "kuhn_k3": lambda records, k: {},
}


def run_probe(
    probe: Probe,
    base: dict[str, Any],
    *,
    seed: int,
    iterations: int,
    out: Path,
    overrides: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, Any]:
    """Train and evaluate one probe in ``out/NAME_seedS``; its figures and references."""
    from mage_rl.config import TrainConfig, load_config
    from mage_rl.rl.trainer import Trainer

    run_dir = out / f"{probe.name}_seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "probe.yaml"
    config_path.write_text(yaml.safe_dump(probe_config(probe, base, seed, iterations)))
    cfg = load_config(config_path, list(overrides), TrainConfig)
    started = time.perf_counter()
    resume = (run_dir / "checkpoints").is_dir()
    Trainer(cfg, run_dir, resume=resume, progress=progress).run()
    seconds = time.perf_counter() - started
    report = json.loads((run_dir / "report.json").read_text())
    final = sorted((run_dir / "eval").glob("iter_*.jsonl"))[-1]
    result: dict[str, Any] = {
        "probe": probe.name,
        "question": probe.question,
        "seed": seed,
        "iterations": iterations,
        "train_seconds": round(seconds, 1),
        "run_dir": str(run_dir),
        "oracle": report.get("oracle"),
        "verdicts": report.get("verdicts", {}),
        "ev_by_episode": {},
    }
    for label, path in (("untrained", run_dir / "eval" / "untrained.jsonl"), ("trained", final)):
        summary = json.loads(path.with_suffix(".json").read_text())
        block = summary.get("stratified") or summary["intervals"]
        result["ev_by_episode"][label] = block.get("ev@k")
        result[label] = FIGURES[probe.name](read_records(path), probe.episodes)
    return result


def bench_learning(
    *,
    config: str | Path,
    probes: Sequence[str],
    seeds: Sequence[int],
    iterations: int | Mapping[str, int] | None,
    out: str | Path,
    overrides: Sequence[str] = (),
    log: Callable[[str], None] = print,
    started: float | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run the probes for every seed; write ``learning.json`` and ``learning.md``.

    ``iterations``: one count for every probe, or counts by probe name (the others keep
    their own), or None (each probe its own).

    Raises:
        ValueError: An unknown probe name.
    """
    from mage_rl.config_yaml import read_yaml

    counts = dict(iterations) if isinstance(iterations, Mapping) else {}
    unknown = [p for p in [*probes, *counts] if p not in PROBES]
    if unknown:
        raise ValueError(f"unknown probe(s) {unknown}; valid: {', '.join(PROBES)}")
    out = Path(out)
    base = read_yaml(Path(config))
    for key in ("plugins",):
        if base.get(key):
            base[key] = [
                str(Path(config).parent / p) if p.endswith(".py") else p for p in base[key]
            ]
    doc: dict[str, Any] = {
        "config": str(config),
        "overrides": list(overrides),
        "settings": {key: base.get(key) for key in SHARED_SECTIONS if key in base},
        "results": [],
    }
    for name in probes:
        probe = PROBES[name]
        for seed in seeds:
            its = counts.get(name, probe.iterations) if counts or iterations is None else iterations
            assert isinstance(its, int)
            log(f"probe {name}, seed {seed}: {its} iterations")
            result = run_probe(
                probe, base, seed=seed, iterations=its, out=out, overrides=overrides,
                progress=progress,
            )  # fmt: skip
            doc["results"].append(result)
            write_results(out / "learning.json", doc, started=started)
    (out / "learning.md").write_text(format_learning(doc) + "\n")
    return doc


def fmt_estimate(est: dict[str, Any] | None, digits: int = 2, sign: bool = False) -> str:
    if not est or est.get("mean") is None:
        return "–"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    if est.get("low") is None:
        return f.format(est["mean"])
    return f"{f.format(est['mean'])} [{f.format(est['low'])}, {f.format(est['high'])}]"


def format_learning(doc: dict[str, Any]) -> str:
    """The suite as markdown: one table per probe, every seed a row, with the references."""
    lines: list[str] = []
    by_probe: dict[str, list[dict[str, Any]]] = {}
    for result in doc["results"]:
        by_probe.setdefault(result["probe"], []).append(result)
    for name, results in by_probe.items():
        probe = PROBES[name]
        lines += [f"### {name}: {probe.question}", ""]
        if name == "rps":
            k = probe.episodes
            lines += [
                "| seed | model | " + " | ".join(f"win, round {i + 1}" for i in range(k))
                + " | rounds 2-3 beat the last move shown |",
                "| --- | --- |" + " --- |" * (k + 1),
            ]  # fmt: skip
            for r in results:
                for label in ("untrained", "trained"):
                    f = r[label]
                    lines.append(
                        f"| {r['seed']} | {label} | "
                        + " | ".join(fmt_estimate(w) for w in f["win_by_round"])
                        + f" | {fmt_estimate(f['beats_last_shown'])} |"
                    )
            lines += ["| | Bayes play | 0.33 | 1.00 | 1.00 | 1.00 |", ""]
        elif name == "kuhn_card":
            lines += [
                "| seed | model | BET with J / Q / K, no bet to face | BET (call) with J / Q / K, "
                "facing a bet | ev@1 (chips) |",
                "| --- | --- | --- | --- | --- |",
            ]
            for r in results:
                for label in ("untrained", "trained"):
                    shares = r[label]["bet_share"]
                    cells = [
                        " / ".join(
                            f"{shares.get(spot, {}).get(c, {}).get('mean', float('nan')):.2f}"
                            for c in "JQK"
                        )
                        for spot in ("no bet to face", "facing a bet")
                    ]
                    ev = (r["ev_by_episode"].get(label) or [None])[0]
                    lines.append(
                        f"| {r['seed']} | {label} | {cells[0]} | {cells[1]} | {fmt_estimate(ev, 3, True)} |"
                    )
            oracle = (results[0].get("oracle") or {}).get("first", {})
            if oracle:
                lines.append(f"| | best response (exact value) | | | {oracle['best_fixed']:+.3f} |")
            lines.append("")
        elif name == "showdown":
            lines += [
                "| seed | model | first episode calls | last episode calls after weak / strong "
                "/ nothing shown | ev, episode 1 | ev, episode 2 |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for r in results:
                for label in ("untrained", "trained"):
                    f, evs = r[label], r["ev_by_episode"].get(label) or [None, None]
                    after = f["last_call_share_by_situation"]
                    seen = " / ".join(
                        fmt_estimate(after.get(f"{s} shown"), 2).split(" ")[0]
                        for s in ("weak", "strong", "nothing")
                    )
                    lines.append(
                        f"| {r['seed']} | {label} | {fmt_estimate(f['first_call_share'])} | "
                        f"{seen} | " + " | ".join(fmt_estimate(e, 3, True) for e in evs) + " |"
                    )
            oracle = (results[0].get("oracle") or {}).get("second", {})
            if oracle:
                lines.append(
                    f"| | exact: call first, then only a weak hand | 1.00 | 1.00 / 0.00 / – | "
                    f"-0.250 | {oracle['bayes_last_hand']:+.3f} |"
                )
                lines.append(f"| | best fixed (exact) | | | | {oracle['best_fixed']:+.3f} |")
            lines.append("")
        else:
            k = probe.episodes
            lines += [
                "| seed | model | " + " | ".join(f"ev, hand {i + 1}" for i in range(k)) + " |",
                "| --- | --- |" + " --- |" * k,
            ]
            for r in results:
                for label in ("untrained", "trained"):
                    evs = r["ev_by_episode"].get(label) or []
                    lines.append(
                        f"| {r['seed']} | {label} | "
                        + " | ".join(fmt_estimate(e, 3, True) for e in evs)
                        + " |"
                    )
            oracle = results[0].get("oracle") or {}
            if oracle:
                fixed = (oracle["first"]["best_fixed"] + oracle["second"]["best_fixed"]) / 2
                bayes = [oracle[s].get("bayes_last_hand") for s in ("first", "second")]
                lines.append(
                    f"| | best fixed (exact, both seats) | {fixed:+.3f} | {fixed:+.3f} | {fixed:+.3f} |"
                )
                if None not in bayes:
                    lines.append(
                        f"| | Bayes last hand (exact, both seats) | | | {sum(bayes) / 2:+.3f} |"
                    )
            lines.append("")
        verdict_rows = [
            (r["seed"], key, v["apart"])
            for r in results
            for key, v in sorted(r.get("verdicts", {}).items())
        ]
        if verdict_rows:
            lines.append(
                "Verdicts (last episode above; paired against the first episode and the "
                "untrained model, intervals apart against the best fixed): "
                + "; ".join(f"seed {s} {k}: {'yes' if a else 'no'}" for s, k, a in verdict_rows)
            )
            lines.append("")
    stamp = doc.get("provenance", {})
    if stamp:
        lines.append(
            f"Written by `{stamp.get('command')}` at commit {stamp.get('commit', '?')}, "
            f"torch threads {stamp.get('torch_threads', '?')}."
        )
    return "\n".join(lines)
