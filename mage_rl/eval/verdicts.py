"""The verdicts of a training report: is the trained agent's last episode above its own
first episode, the best fixed strategy and the untrained model?

``report.json`` keeps them under ``verdicts``. The comparisons with the first episode and
with the untrained model are paired: both evaluations play the same tasks, so the
difference is taken task by task (:mod:`mage_rl.eval.paired`) and ``apart`` means its
95 % interval lies above 0. The best fixed strategy is an exact value; there ``apart``
means the last episode's interval lies above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mage_rl.eval.paired import episode_payoffs, episode_value, paired_difference
from mage_rl.eval.stratified import payoff_range
from mage_rl.eval.training import UNTRAINED, eval_tasks


def fmt_payoff(est: dict[str, Any] | None) -> str:
    """``+0.123 [+0.050, +0.200]``, the mean alone without an interval, ``–`` for none."""
    if not est or est.get("mean") is None:
        return "–"
    if est.get("low") is None:
        return f"{est['mean']:+.3f}"
    return f"{est['mean']:+.3f} [{est['low']:+.3f}, {est['high']:+.3f}]"


def episode_ev(summary: dict[str, Any], index: int) -> dict[str, Any] | None:
    """Episode ``index``'s ev over all seats with its interval (stratified when it is)."""
    block = summary.get("stratified") or summary["intervals"]
    evs = block.get("ev@k") if block else None
    if not evs or index >= len(evs) or evs[index].get("mean") is None:
        return None
    return evs[index]


def seat_weights(cfg: Any) -> dict[str, float]:
    """Each seat's share of the tasks (``env.seat``)."""
    seat = str(cfg.env.seat)
    if seat in ("first", "0"):
        return {"first": 1.0}
    if seat in ("second", "1"):
        return {"second": 1.0}
    return {"first": 0.5, "second": 0.5}


def pair(
    last: dict[str, Any],
    other: dict[str, Any],
    label: str,
    paired: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One verdict: both estimates, and whether the last episode is the higher.

    With ``paired`` (the task-by-task difference, :func:`~mage_rl.eval.paired.
    paired_difference`) ``apart`` means its 95 % interval lies above 0; without it (an
    exact reference), that the two intervals do not overlap. ``intervals_apart`` is
    always the unpaired check.
    """
    keep = ("mean", "low", "high", "n")
    disjoint = bool(
        last.get("low") is not None
        and other.get("high") is not None
        and last["low"] > other["high"]
    )
    out = {"last": {k: last.get(k) for k in keep}, label: {k: other.get(k) for k in keep}}
    if paired is None:
        return {**out, "apart": disjoint, "intervals_apart": disjoint}
    low = paired["difference"].get("low")
    return {**out, "paired": paired, "apart": bool(low is not None and low > 0),
            "intervals_apart": disjoint}  # fmt: skip


def paired_verdicts(run_dir: Path, cfg: Any, final: str) -> dict[str, dict[str, Any]]:
    """The task-by-task differences behind ``last_vs_first`` (the final evaluation's
    episode K minus its episode 1) and ``last_vs_untrained`` (its episode K minus the
    untrained model's, on the same tasks); empty where the files are missing."""
    trained_file = run_dir / "eval" / f"{final}.jsonl"
    if not trained_file.exists():
        return {}
    trained = episode_payoffs(trained_file)
    design = eval_tasks(cfg)[1] if cfg.eval.stratify else None
    bounds = payoff_range(cfg.env.name)
    last = {t: episode_value(p, cfg.meta.episodes - 1) for t, p in trained.items()}
    out = {}
    if cfg.meta.episodes > 1:
        first = {t: episode_value(p, 0) for t, p in trained.items()}
        out["last_vs_first"] = paired_difference(last, first, bounds, design)
    untrained_file = run_dir / "eval" / f"{UNTRAINED}.jsonl"
    if untrained_file.exists():
        before = {
            t: episode_value(p, cfg.meta.episodes - 1)
            for t, p in episode_payoffs(untrained_file).items()
        }
        out["last_vs_untrained"] = paired_difference(last, before, bounds, design)
    return out


def verdicts(
    rows: list[tuple[str, dict[str, Any]]],
    oracle: dict | None,
    cfg: Any,
    paired: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The trained agent's last episode against its first, the best fixed strategy and
    the untrained model, in the game's payoff with 95 % intervals (``report.json``).

    ``paired`` (:func:`paired_verdicts`) holds the task-by-task differences of the first
    and the third comparison; where one is given, its interval decides ``apart``. The best fixed strategy is the exact value of the best strategy that ignores earlier
    episodes (``mage oracle``), weighted over the seats the tasks use; its interval is the
    value itself. A verdict is left out when its numbers are missing (no payoff, no
    oracle, no untrained evaluation).
    """
    named = dict(rows)
    after = next((s for n, s in rows if n.startswith("trained")), None)
    if after is None:
        return {}
    k = cfg.meta.episodes
    last = episode_ev(after, k - 1)
    if last is None:
        return {}
    out: dict[str, Any] = {}
    first = episode_ev(after, 0)
    if first is not None and k > 1:
        out["last_vs_first"] = pair(last, first, "first", (paired or {}).get("last_vs_first"))
    if oracle:
        weights = seat_weights(cfg)
        value = sum(w * oracle[seat]["best_fixed"] for seat, w in weights.items())
        out["last_vs_best_fixed"] = pair(
            last, {"mean": value, "low": value, "high": value, "n": None}, "best_fixed"
        )
    before = named.get(UNTRAINED)
    untrained = episode_ev(before, k - 1) if before else None
    if untrained is not None:
        out["last_vs_untrained"] = pair(
            last, untrained, "untrained", (paired or {}).get("last_vs_untrained")
        )
    return out


VERDICT_FIELDS = ("last", "apart", "paired", "intervals_apart")
"""The fields of a verdict other than the estimate it compares with."""

VERDICT_WORDS = {
    "last_vs_first": "its own first episode",
    "last_vs_best_fixed": "the best fixed strategy (exact)",
    "last_vs_untrained": "the untrained model's last episode",
}


def verdict_lines(found: dict[str, Any], k: int) -> list[str]:
    lines = []
    for key, words in VERDICT_WORDS.items():
        if key not in found:
            continue
        v = found[key]
        other = next(val for name, val in v.items() if name not in VERDICT_FIELDS)
        paired = v.get("paired")
        if paired is not None:
            diff = paired["difference"]
            gap = f"; the difference, paired over {paired['tasks']} tasks, {fmt_payoff(diff)}"
            if v["apart"]:
                word = "above, the paired 95 % interval above 0"
            elif diff.get("mean") is not None and diff["mean"] > 0:
                word = "above, but the paired 95 % interval reaches 0"
            else:
                word = "not above"
        else:
            gap = ""
            if v["apart"]:
                word = "above, 95 % intervals apart"
            elif v["last"]["mean"] > other["mean"]:
                word = "above, but the 95 % intervals overlap"
            else:
                word = "not above"
        exact = other.get("low") == other.get("high")
        shown = f"{other['mean']:+.4f}" if exact else fmt_payoff(other)
        lines.append(
            f"- `{key}`: trained {fmt_payoff(v['last'])} against {words} {shown}{gap}: {word}."
        )
    return lines
