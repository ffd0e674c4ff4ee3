"""The run folder of ``mage eval``: conditions, task instances and records on disk.

A run folder holds ``config.json`` (conditions and agents), ``tasks.json`` (every task
instance: seed, opponent, seat) and ``records/<agent>/<env>.jsonl``, one finished
meta-episode per line. Reopening a folder checks that the conditions are the same;
agents may be added. The records are the source of truth from which
:mod:`mage_rl.eval.report` recomputes every metric.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from mage_rl.eval.agents import AgentSpec
from mage_rl.eval.conditions import EvalConfig, opponent_population
from mage_rl.eval.settings import EvalSettings
from mage_rl.fileio import atomic_write_json, atomic_write_lines
from mage_rl.graphs.rollouts import TaskInstance
from mage_rl.records import MetaEpisodeRecord

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def tasks_document(cfg: EvalConfig, tasks: dict[str, list[TaskInstance]]) -> dict[str, Any]:
    """``tasks.json``: per environment the population and every task instance."""
    out = {}
    for env, items in tasks.items():
        population = opponent_population(str(cfg.opponents), env)
        out[env] = {
            "population": [
                [s, float(w)] for s, w in zip(population.specs, population.weights, strict=True)
            ],
            "tasks": [asdict(t) for t in items],
        }
    return out


def prepare_run_dir(
    out: Path, cfg: EvalConfig, tasks: dict[str, list[TaskInstance]]
) -> list[AgentSpec]:
    """Create or reopen a run folder; returns every agent it holds (old, then new).

    Raises:
        ValueError: The folder holds an evaluation under other conditions, other task
            instances, or an agent of the same label with another style or model.
    """
    out.mkdir(parents=True, exist_ok=True)
    config_path, tasks_path = out / "config.json", out / "tasks.json"
    agents = list(cfg.agents)
    tasks_doc = tasks_document(cfg, tasks)
    if config_path.exists():
        saved = json.loads(config_path.read_text())
        old = saved.get("conditions", {})
        new = json.loads(json.dumps(cfg.conditions()))
        # A condition added after the folder was written counts as its default there;
        # one no longer shared (a play setting, now recorded per agent) is not compared.
        for f in fields(EvalSettings):
            if f.name in new and f.name not in old and f.default is not MISSING:
                old[f.name] = f.default
        diffs = [
            f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(new)
            if old.get(key) != new.get(key)
        ]
        if diffs:
            raise ValueError(
                f"{out} holds an evaluation under other conditions ({'; '.join(diffs)}); "
                "rerun with its flags to resume it, or pick a new --out"
            )
        saved_agents = [AgentSpec(**a) for a in saved.get("agents", [])]
        by_label = {a.label: a for a in saved_agents}
        for agent in cfg.agents:
            prior = by_label.get(agent.label)
            if prior is None:
                continue
            if (prior.style, prior.model) != (agent.style, agent.model):
                raise ValueError(
                    f"{out} already has agent {agent.label!r} as {prior.style}={prior.model}, "
                    f"not {agent.style}={agent.model}; give the new one another @LABEL"
                )
            changed = [
                f"{key}: {prior.play.get(key)!r} -> {value!r}"
                for key, value in agent.play.items()
                if prior.play and prior.play.get(key) != value
            ]
            if changed:
                raise ValueError(
                    f"{out} already has agent {agent.label!r}, played with other settings "
                    f"({'; '.join(changed)}); rerun with its flags to resume it, or give "
                    "the new one another @LABEL"
                )
        current = {a.label: a for a in cfg.agents}
        agents = [current.get(a.label, a) for a in saved_agents]
        agents += [a for a in cfg.agents if a.label not in by_label]
        if tasks_path.exists() and json.loads(tasks_path.read_text()) != tasks_doc:
            raise ValueError(
                f"{tasks_path} lists other task instances than these conditions give; "
                "pick a new --out"
            )
    document = {
        "version": FORMAT_VERSION,
        "conditions": cfg.conditions(),
        "agents": [asdict(a) for a in agents],
    }
    atomic_write_json(config_path, document)
    atomic_write_json(tasks_path, tasks_doc)
    return agents


def records_path(run_dir: Path, agent: str, env: str) -> Path:
    """Where the meta-episodes of one (agent, environment) are appended."""
    return Path(run_dir) / "records" / agent / f"{env}.jsonl"


class RecordLog:
    """An append-only JSONL file of finished meta-episodes.

    Each line is written, flushed and fsynced as its meta-episode finishes. A process
    killed mid-write can leave a partial last line; :meth:`read` drops it (that
    meta-episode is played again) and rewrites the file without it.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[MetaEpisodeRecord]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().split("\n")
        records, torn = [], False
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                records.append(MetaEpisodeRecord.from_json(line))
            except (ValueError, TypeError) as exc:
                if i != len(lines) - 1:  # only the unterminated last line can be torn
                    raise ValueError(f"{self.path}:{i + 1} is not a meta-episode: {exc}") from exc
                torn = True
        if torn:
            log.warning("%s: dropping a partly written last line", self.path)
            atomic_write_lines(self.path, (r.to_json() + "\n" for r in records))
        return records

    def append(self, record: MetaEpisodeRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(record.to_json() + "\n")
            f.flush()
            os.fsync(f.fileno())


def slim(record: MetaEpisodeRecord) -> MetaEpisodeRecord:
    """Drop token ids and log-probs (training data, not evaluation data); texts,
    prompts, lengths and validity stay for inspection."""
    for turn in record.turns:
        turn.prompt_ids, turn.response_ids, turn.logprobs = [], [], []
    return record
