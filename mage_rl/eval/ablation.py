"""``mage ablate``: the same config trained with each variant of some settings, and compared.

An ablation varies one or more config keys (``--vary returns.mode=differential,
single_episode``), trains every combination for every seed with the same budget (each
run a ``mage train`` of its own, in ``OUT/runs/VARIANT/seedN``), and compares the final
evaluations. Every run evaluates the same tasks (``eval.seed`` is not varied by the
seed), so a variant is compared with the first named one meta-episode by meta-episode:
the paired difference of their last episodes, with a 95 % t interval.

What it writes into ``OUT``:

- ``ablation.json``: per variant and seed, the run's status, the first- and last-episode
  payoff with 95 % intervals, every episode's, the share of first episodes that probe
  (where the game defines a probe: a showdown call), the paired verdict against the
  first variant; per variant the verdict across seeds (``across_seeds``: the per-seed
  differences' mean with a t interval over the seeds, which holds the seed-to-seed
  variation of training); the exact references of the game; provenance stamped at the
  start;
- ``ablation.md``: the same as tables, every run shown, failed ones too;
- ``ablation.png``: first and last episode per variant and seed, with the references.

A finished run (its ``report.json`` written) is reused when the command runs again, if its
``config.yaml`` is the one this command would train (the command refuses to start
otherwise); an interrupted one resumes from its newest checkpoint.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mage_rl.eval.paired import paired_difference
from mage_rl.eval.stats import Estimate, bounded, error_bar, mean_interval, wilson_interval

PROBES: dict[str, Callable[[dict[str, Any]], bool]] = {
    # A showdown call is the probe: a fold shows nothing (a draw), a call wins or loses.
    "showdown": lambda episode: episode.get("outcome") in ("won", "lost"),
}
"""Per environment, whether a record's episode probed (what "probe share" counts)."""


def _showdown_seen(earlier: list[dict[str, Any]]) -> str:
    """What the earlier episodes' calls showed: a weak hand, only strong ones, or nothing."""
    outcomes = {e.get("outcome") for e in earlier}
    return (
        "weak shown"
        if "won" in outcomes
        else "strong shown"
        if "lost" in outcomes
        else "nothing shown"
    )


SITUATIONS: dict[str, Callable[[list[dict[str, Any]]], str]] = {"showdown": _showdown_seen}
"""Per environment, what the last episode knew, from the earlier episodes' results: the
summary counts the last episode's probes (calls) per situation."""


@dataclass(frozen=True)
class Variant:
    """One combination of the varied values.

    Attributes:
        overrides: ``(key, value)`` pairs, in the order the keys were named.
    """

    overrides: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.overrides)

    @property
    def slug(self) -> str:
        text = "__".join(f"{k.split('.')[-1]}-{v}" for k, v in self.overrides)
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def parse_vary(items: Sequence[str]) -> list[Variant]:
    """``["a.b=1,2", "c=x,y"]`` -> every combination, the first named values first.

    Raises:
        ValueError: An item without ``=``, an empty value list, a repeated key or value.
    """
    if not items:
        raise ValueError("give at least one --vary KEY=V1,V2")
    axes: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key or not options:
            raise ValueError(
                f"--vary {item!r}: write KEY=V1,V2 (for example returns.mode=differential,single_episode)"
            )
        if key in (k for k, _ in axes):
            raise ValueError(f"--vary names {key!r} twice")
        if len(set(options)) != len(options):
            raise ValueError(f"--vary {item!r} repeats a value")
        axes.append((key, options))
    combos = itertools.product(*[[(key, v) for v in options] for key, options in axes])
    return [Variant(tuple(c)) for c in combos]


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``.

    Raises:
        ValueError: Not a comma-separated list of distinct integers.
    """
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(
            f"--seeds {text!r}: write integers separated by commas, e.g. 0,1,2"
        ) from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r}: give one or more distinct seeds")
    return seeds


def bounded_mean_interval(
    values: Sequence[float], low: float | None, high: float | None, level: float = 0.95
) -> Estimate:
    """A t interval for a mean, kept inside ``[low, high]`` and never a point
    (:func:`~mage_rl.eval.stats.bounded`)."""
    return bounded(mean_interval(values, level), low, high, level)


def final_eval_file(run_dir: Path) -> Path | None:
    """The newest ``eval/iter_NNNNNN.jsonl`` of a run (the final evaluation)."""
    files = sorted((run_dir / "eval").glob("iter_*.jsonl"))
    return files[-1] if files else None


def read_episodes(path: Path) -> dict[tuple[str, int, int], list[dict[str, Any]]]:
    """Per task (opponent, seed, seat), the episode results of its meta-episode."""
    out: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    with path.open() as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                out[(row["opponent"], int(row["seed"]), int(row["seat"]))] = row["episodes"]
    return out


def _payoff(episode: dict[str, Any]) -> float:
    value = episode.get("payoff")
    return float(episode["reward"] if value is None else value)


def run_summary(
    episodes: dict[tuple[str, int, int], list[dict[str, Any]]],
    k: int,
    bounds: tuple[float | None, float | None],
    probe: Callable[[dict[str, Any]], bool] | None,
    situation: Callable[[list[dict[str, Any]]], str] | None = None,
) -> dict[str, Any]:
    """Per-episode payoffs (with intervals), the first episode's probe share, and the last
    episode's probe share per situation (what the earlier episodes showed)."""
    low, high = bounds
    per_episode = []
    for i in range(k):
        values = [_payoff(eps[i]) if i < len(eps) else 0.0 for eps in episodes.values()]
        per_episode.append(bounded_mean_interval(values, low, high).to_dict())
    probes = None
    last_by_situation: dict[str, dict[str, Any]] = {}
    if probe is not None and episodes:
        hits = sum(bool(eps and probe(eps[0])) for eps in episodes.values())
        probes = wilson_interval(hits, len(episodes)).to_dict()
        if situation is not None and k > 1:
            counts: dict[str, list[int]] = {}
            for eps in episodes.values():
                if len(eps) == k:
                    tally = counts.setdefault(situation(eps[:-1]), [0, 0])
                    tally[0] += bool(probe(eps[-1]))
                    tally[1] += 1
            last_by_situation = {
                name: wilson_interval(hit, n).to_dict() for name, (hit, n) in sorted(counts.items())
            }
    return {
        "n": len(episodes),
        "first": per_episode[0],
        "last": per_episode[-1],
        "episodes": per_episode,
        "first_probe_share": probes,
        "last_probe_share_by_situation": last_by_situation,
    }


def paired_last(
    reference: dict[tuple[str, int, int], list[dict[str, Any]]],
    other: dict[tuple[str, int, int], list[dict[str, Any]]],
    bounds: tuple[float | None, float | None],
) -> dict[str, Any]:
    """Reference minus other, last episode, over the tasks both played."""
    ref = {t: _payoff(eps[-1]) for t, eps in reference.items()}
    oth = {t: _payoff(eps[-1]) for t, eps in other.items()}
    found = paired_difference(ref, oth, bounds)  # type: ignore[arg-type]
    return {"tasks": found["tasks"], "difference": found["difference"]}


def verdict(
    paired: dict[str, Any], ref_last: dict[str, Any], other_last: dict[str, Any]
) -> dict[str, Any]:
    """``apart`` when the paired interval lies above 0 (the first named variant higher);
    ``intervals_apart`` is the unpaired check (the two last-episode intervals disjoint)."""
    diff = paired["difference"]
    above = diff.get("low") is not None and diff["low"] > 0
    below = diff.get("high") is not None and diff["high"] < 0
    disjoint = (
        ref_last.get("low") is not None
        and other_last.get("high") is not None
        and ref_last["low"] > other_last["high"]
    )
    word = "apart" if above else "apart, the variant higher" if below else "not apart"
    return {**paired, "verdict": word, "apart": above, "intervals_apart": disjoint}


def across_seeds(variant: dict[str, Any]) -> dict[str, Any] | None:
    """The reference minus the variant over the seeds: the mean of the per-seed paired
    differences with a t interval over the seeds, so that it holds how much training
    itself varies from seed to seed (a per-seed verdict holds only the evaluation's
    noise). ``apart`` when the interval lies above 0; ``None`` with fewer than 2 seeds."""
    diffs = [
        r["verdict"]["difference"]["mean"]
        for r in variant["seeds"].values()
        if r.get("verdict") and r["verdict"]["difference"].get("mean") is not None
    ]
    if len(diffs) < 2:
        return None
    est = mean_interval(diffs).to_dict()
    above = est["low"] is not None and est["low"] > 0
    below = est["high"] is not None and est["high"] < 0
    word = "apart" if above else "apart, the variant higher" if below else "not apart"
    return {"seeds": len(diffs), "difference": est, "verdict": word, "apart": above}


def references(cfg: Any) -> dict[str, Any]:
    """Exact values for the config's game and evaluation population, where known."""
    from mage_rl import runtime
    from mage_rl.eval.training_report import oracle_values

    if cfg.env.name == "showdown":
        from mage_rl.envs.showdown_values import showdown_values

        population = runtime.eval_population(cfg)
        weights = dict(zip(population.specs, population.weights, strict=True))
        values = showdown_values(
            weights,
            cfg.meta.episodes,
            gamma_traj=cfg.returns.gamma_traj,
            omega=cfg.advantages.omega,
        )
        return {
            "best_fixed": values.best_fixed,
            "ceiling": values.ceiling,
            "optimum_last": {n: p.last for n, p in values.objectives.items()},
            "credit_plans": {
                mode: {"first_answer": p.first_answer, "last": p.last, "margin": p.first_margin}
                for mode, p in values.credit.items()
            },
            "gamma_traj": values.gamma_traj,
            "command": f"mage oracle showdown --episodes {cfg.meta.episodes} "
            f"--gamma-traj {cfg.returns.gamma_traj:g} --omega {cfg.advantages.omega:g}",
        }
    found = oracle_values(cfg)
    return {"seats": found} if found else {}


def implied(variant: Variant) -> list[str]:
    """Overrides a variant needs to be valid: ``returns.reward_to_go`` drops the past
    term of the differential return, which the other modes do not have, so a variant
    that is not differential trains with it off (their returns are reward-to-go as
    they are)."""
    modes = [v for k, v in variant.overrides if k == "returns.mode"]
    return ["returns.reward_to_go=false"] if modes and modes[0] != "differential" else []


def variant_overrides(variant: Variant, sets: Sequence[str]) -> list[str]:
    """Every ``--set`` of one variant's runs: the common ones, its own, what they imply."""
    return [*sets, *(f"{k}={v}" for k, v in variant.overrides), *implied(variant)]


def train_command(
    config: str, variant: Variant, seed: int, run_dir: Path, sets: Sequence[str]
) -> list[str]:
    """The ``mage train`` command line of one run."""
    command = [sys.executable, "-m", "mage_rl.cli", "train", config, "--run-dir", str(run_dir)]
    overrides = variant_overrides(variant, sets)
    overrides += [f"rollout.seed={seed}", f"learner.seed={seed}"]
    for item in overrides:
        command += ["--set", item]
    return command


def finished(run_dir: Path) -> bool:
    """Whether a run folder holds a finished run (its report and final evaluation)."""
    return (run_dir / "report.json").exists() and final_eval_file(run_dir) is not None


def reuse_problem(
    run_dir: Path, config: str, variant: Variant, seed: int, sets: Sequence[str]
) -> str | None:
    """Why the finished run in ``run_dir`` cannot stand for this variant and seed: the
    settings in which its ``config.yaml`` differs from the one this command would train
    (``None`` when none does). Settings the saved file lacks (a newer version of this
    package added them) are not compared."""
    import yaml

    from mage_rl.config import load_config
    from mage_rl.train_folder import CONFIG_FILE, _flatten, recorded_config

    saved_path = run_dir / CONFIG_FILE
    if not saved_path.exists():
        return f"{saved_path} is missing"
    overrides = [*variant_overrides(variant, sets), f"rollout.seed={seed}", f"learner.seed={seed}"]
    fresh = _flatten(recorded_config(load_config(config, overrides).model_dump(mode="json")))
    saved = _flatten(yaml.safe_load(saved_path.read_text()) or {})
    changed = [
        f"{key} (the run has {saved[key]!r}, this command {fresh[key]!r})"
        for key in sorted(set(saved) & set(fresh))
        if saved[key] != fresh[key]
    ]
    return "; ".join(changed) or None


def run_one(command: list[str], run_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Train one run unless it has finished (resuming an interrupted one). A finished
    run is reused; its entry says when and at which commit it was trained."""
    from mage_rl.train_folder import latest_checkpoint

    if finished(run_dir):
        stamp = json.loads((run_dir / "report.json").read_text()).get("provenance", {})
        trained = {k: stamp.get(k) for k in ("commit", "dirty", "started_at", "wall_seconds")}
        return {"status": "done", "reused": True, "trained": trained}
    run_dir.mkdir(parents=True, exist_ok=True)
    if latest_checkpoint(run_dir) is not None:
        command = [*command, "--resume"]
    started = time.time()
    with (run_dir / "train.log").open("a") as out:
        code = subprocess.run(
            [*command, "--no-progress"], stdout=out, stderr=subprocess.STDOUT
        ).returncode
    wall = round(time.time() - started, 1)
    if code != 0:
        tail = (run_dir / "train.log").read_text(errors="replace").splitlines()[-5:]
        log(f"  failed (exit {code}) after {wall:.0f} s; see {run_dir / 'train.log'}")
        return {"status": "failed", "exit_code": code, "wall_seconds": wall, "log_tail": tail}
    return {"status": "done", "wall_seconds": wall}


def _fmt(est: dict[str, Any] | None, digits: int = 3) -> str:
    if not est or est.get("mean") is None:
        return "–"
    if est.get("low") is None:
        return f"{est['mean']:+.{digits}f}"
    return f"{est['mean']:+.{digits}f} [{est['low']:+.{digits}f}, {est['high']:+.{digits}f}]"


def _share(est: dict[str, Any] | None) -> str:
    if not est or est.get("mean") is None:
        return "–"
    return f"{est['mean']:.2f} [{est['low']:.2f}, {est['high']:.2f}]"


def markdown(doc: dict[str, Any]) -> str:
    """``ablation.md``: every run of every variant, the verdicts and the references."""
    prov = doc.get("provenance", {})
    lines = [
        f"# Ablation of {doc['config']}",
        "",
        f"Command: `{doc['command']}`, commit {prov.get('commit', '?')}"
        f"{' (dirty)' if prov.get('dirty') else ''}, started {prov.get('started_at', '?')}. "
        f"Varied: {', '.join(doc['vary'])}; seeds {', '.join(map(str, doc['seeds']))}; the "
        "same budget for every variant. Payoffs per episode on the final evaluation's "
        "tasks (the same for every run), 95 % intervals; verdict: the paired difference "
        f"of the last episode, {doc['reference']} minus the variant.",
        "",
        "| variant | seed | status | first episode | last episode | first-episode probes | last vs first named | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for variant in doc["variants"]:
        for seed, run in variant["seeds"].items():
            if run["status"] != "done":
                lines.append(
                    f"| {variant['name']} | {seed} | {run['status']} (exit {run.get('exit_code')}) | | | | | |"
                )
                continue
            v = run.get("verdict")
            status = "done"
            if run.get("reused"):
                when = run.get("trained") or {}
                commit = (when.get("commit") or "?")[:7] + (" dirty" if when.get("dirty") else "")
                status = (
                    f"done (reused: trained at {commit}, {(when.get('started_at') or '?')[:10]})"
                )
            lines.append(
                f"| {variant['name']} | {seed} | {status} | {_fmt(run['first'])} | **{_fmt(run['last'])}** | "
                f"{_share(run['first_probe_share'])} | {_fmt(v['difference']) if v else '(reference)'} | "
                f"{v['verdict'] if v else ''} |"
            )
    summaries = [(v["name"], v.get("across_seeds")) for v in doc["variants"][1:]]
    if any(found for _, found in summaries):
        lines += [
            "",
            f"Across seeds: {doc['reference']} minus the variant, last episode, the mean of "
            "the per-seed paired differences with a 95 % t interval over the seeds. Seeds "
            "train differently, so this is the verdict on the setting; a per-seed verdict "
            "above holds only the evaluation's noise, not how much a run varies.",
            "",
            "| variant | seeds | difference | verdict |",
            "| --- | ---: | --- | --- |",
        ]
        for name, found in summaries:
            if found:
                lines.append(
                    f"| {name} | {found['seeds']} | {_fmt(found['difference'])} | {found['verdict']} |"
                )
    refs = doc.get("references") or {}
    if refs:
        lines += ["", "Exact references: `" + json.dumps(refs) + "`"]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> Path:
    """First and last episode per variant and seed, with the exact references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(doc["variants"])), 3.8))
    labels = []
    for i, variant in enumerate(doc["variants"]):
        labels.append(variant["name"].replace(", ", "\n"))
        runs = [r for r in variant["seeds"].values() if r["status"] == "done"]
        for j, run in enumerate(runs):
            x = i + (j - (len(runs) - 1) / 2) * 0.12
            for key, color, shift in (("first", "tab:gray", -0.03), ("last", "tab:blue", 0.03)):
                est = run[key]
                below, above = error_bar(est)
                ax.errorbar(x + shift, est["mean"], yerr=[[below], [above]], fmt="o", color=color, ms=4, capsize=2,
                            label=f"{key} episode" if i == 0 and j == 0 else None)  # fmt: skip
    refs = doc.get("references") or {}
    if "best_fixed" in refs:
        ax.axhline(refs["best_fixed"], color="tab:red", ls=":", lw=1, label="best fixed")
    if "optimum_last" in refs:
        ax.axhline(
            refs["optimum_last"]["final"],
            color="tab:green",
            ls="--",
            lw=1,
            label="optimum, last episode",
        )
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("payoff per episode")
    ax.set_title(f"Ablation of {Path(doc['config']).name}, every seed", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _finite(doc: Any) -> Any:
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_finite(v) for v in doc]
    return doc
