"""What ``mage view`` reads from run folders, as plain data for the page.

Two kinds of folder are read:

* a **training run** (``mage train``; it holds ``config.yaml`` and ``metrics.jsonl``):
  the learning curve from ``metrics.jsonl``, the evaluation rows, exact values, verdicts
  and answer tables from ``report.json``, the evaluated meta-episodes from
  ``eval/*.jsonl`` and the training meta-episodes with every call's credit from
  ``samples/iter_*.jsonl.gz``;
* an **evaluation** (``mage eval --out DIR``; it holds ``config.json`` and ``records/``):
  the results of every agent from ``results.json`` and their meta-episodes from
  ``records/<agent>/<env>.jsonl``, the agents on the same tasks.

Every meta-episode becomes one :func:`meta_episode` dict (the page's own shape) and one
row of the index the page filters and pages (:data:`INDEX_COLUMNS`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mage_rl.rl.samples import read_samples

INDEX_COLUMNS = (
    "run", "source", "label", "iteration", "agent", "env", "opponent", "seat", "seed",
    "rollout", "rewards", "outcome",
)  # fmt: skip
"""The fields of an index row, in order (each row is a list)."""

CURVE_KEYS = ("charts/ev@1", "charts/success@1", "charts/invalid_share")
_ITER = re.compile(r"^iter_(\d+)$")


def folder_kind(path: Path) -> str:
    """``train`` or ``eval``.

    Raises:
        ValueError: ``path`` is neither a training run nor an evaluation folder.
    """
    if (path / "metrics.jsonl").exists() or (path / "config.yaml").exists():
        return "train"
    if (path / "records").is_dir():
        return "eval"
    raise ValueError(
        f"{path} is neither a training run (config.yaml, metrics.jsonl) nor an evaluation "
        "folder of mage eval (records/)"
    )


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


# -- the run's summary ---------------------------------------------------------------------


def run_summary(path: Path, name: str) -> dict[str, Any]:
    """The figures of one folder: curve, results with intervals, exact values, verdicts,
    answer tables."""
    kind = folder_kind(path)
    if kind == "eval":
        results = _json(path / "results.json") or {}
        return {
            "name": name,
            "kind": kind,
            "path": str(path),
            "results": {agent: envs for agent, envs in (results.get("results") or {}).items()},
            "oracle": results.get("oracle"),
            "conditions": results.get("conditions"),
        }
    report = _json(path / "report.json") or {}
    return {
        "name": name,
        "kind": kind,
        "path": str(path),
        "curve": learning_curve(path),
        "rows": report.get("rows", {}),
        "oracle": report.get("oracle"),
        "verdicts": report.get("verdicts"),
        "decisions": report.get("decisions"),
        "decisions_by_episode": report.get("decisions_by_episode"),
    }


def learning_curve(path: Path) -> dict[str, Any]:
    """Per iteration of ``metrics.jsonl``: the training batch's ev and success in the
    first and last episode, the invalid share, and the evaluation's ev@K where one ran."""
    rows: dict[int, dict[str, Any]] = {}
    metrics = path / "metrics.jsonl"
    if metrics.exists():
        for row in _read_jsonl(metrics):
            rows.setdefault(int(row["iteration"]), {}).update(row)
    ks = sorted(
        {int(k.rsplit("@", 1)[1]) for row in rows.values() for k in row
         if k.startswith("charts/ev@")}
    )  # fmt: skip
    last = ks[-1] if ks else 1
    iterations = sorted(rows)
    series = {
        "ev@1": [rows[i].get("charts/ev@1") for i in iterations],
        f"ev@{last}": [rows[i].get(f"charts/ev@{last}") for i in iterations],
        "success@1": [rows[i].get("charts/success@1") for i in iterations],
        f"success@{last}": [rows[i].get(f"charts/success@{last}") for i in iterations],
        "invalid": [rows[i].get("charts/invalid_share") for i in iterations],
        f"eval ev@{last}": [rows[i].get(f"eval/ev@{last}") for i in iterations],
    }
    return {"iterations": iterations, "k": last, "series": series}


# -- meta-episodes -------------------------------------------------------------------------


def _label(stem: str) -> tuple[str, int | None]:
    match = _ITER.match(stem)
    if match:
        n = int(match.group(1))
        return f"trained (iter {n})", n
    return stem, 0 if stem == "untrained" else None


def meta_episodes(path: Path) -> Iterator[tuple[str, str, int | None, dict[str, Any]]]:
    """Every meta-episode of a folder as ``(source, label, iteration, record)``: the
    training samples first (by iteration), then the evaluations."""
    if folder_kind(path) == "eval":
        for agent_dir in sorted(p for p in (path / "records").iterdir() if p.is_dir()):
            for file in sorted(agent_dir.glob("*.jsonl")):
                for record in _read_jsonl(file):
                    yield "eval", agent_dir.name, None, record
        return
    for row in read_samples(path):  # the saved training batches, by iteration
        n = int(row["iteration"])
        yield "train", f"training batch (iter {n})", n, row
    files = sorted((path / "eval").glob("*.jsonl"),
                   key=lambda f: (f.stem != "untrained", f.stem.startswith("iter_"), f.stem))  # fmt: skip
    for file in files:
        label, iteration = _label(file.stem)
        for record in _read_jsonl(file):
            yield "eval", label, iteration, record


def _exact(value: Any) -> Any:
    """An integer as the page can hold it: past 2**53 a JavaScript number is no longer
    exact (task seeds are 64-bit), so such an integer travels as text."""
    return str(value) if isinstance(value, int) and abs(value) > 2**53 else value


def _number(value: Any) -> float | None:
    return None if value is None else round(float(value), 6)


def _call(turn: dict[str, Any]) -> dict[str, Any]:
    """One call in the page's shape, from a saved sample's call or a record's turn."""
    sampled = "response" in turn
    prompt = turn.get("prompt") if sampled else turn.get("prompt_text")
    call = {
        "node": turn.get("node") or turn.get("kind", ""),
        "kind": turn.get("kind", ""),
        "episode": turn.get("episode", 0),
        "step": turn.get("step", 0),
        "prompt": prompt or "",
        "response": turn.get("response") if sampled else turn.get("text", ""),
        "invalid": bool(turn.get("invalid")),
        "reward": _number(turn.get("reward")),
    }
    if sampled:
        call.update(
            tokens=turn.get("tokens") or [],
            logprobs=[round(float(x), 4) for x in turn.get("logprobs") or []],
            ret=_number(turn.get("return")),
            score=_number(turn.get("score")),
            a_episode=_number(turn.get("a_episode")),
            a_step=_number(turn.get("a_step")),
            advantage=_number(turn.get("advantage")),
        )
    return call


def meta_episode(
    run: int, source: str, label: str, iteration: int | None, record: dict[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The index row and the page's dict of one meta-episode."""
    episodes = [
        {"index": e.get("index", i), "outcome": e.get("outcome", ""),
         "reward": _number(e.get("reward")), "payoff": _number(e.get("payoff"))}
        for i, e in enumerate(record.get("episodes") or [])
    ]  # fmt: skip
    turns = record.get("calls") if "calls" in record else record.get("turns")
    rewards = [e["payoff"] if e["payoff"] is not None else e["reward"] for e in episodes]
    outcome = episodes[-1]["outcome"] if episodes else ""
    row = [
        run, source, label, iteration, record.get("agent", ""), record.get("env", ""),
        record.get("opponent", ""), record.get("seat", 0), _exact(record.get("seed", 0)),
        record.get("rollout", 0), rewards, outcome,
    ]  # fmt: skip
    full = dict(zip(INDEX_COLUMNS, row, strict=True))
    full.update(
        episodes=episodes,
        reflections=list(record.get("reflections") or []),
        calls=[_call(t) for t in turns or []],
    )
    return row, full
