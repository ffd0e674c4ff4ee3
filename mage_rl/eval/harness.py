"""``mage eval``: several agents under identical conditions, resumable.

1. The conditions (:class:`EvalConfig`) fix everything but the agent: environments,
   opponent set, ``n`` task instances per environment drawn once with
   :func:`~mage_rl.rl.rollout.sample_tasks` from one base seed, K, the episode protocol,
   the sampling settings (default: the paper's evaluation sampling, temperature 0.7,
   top-p 0.8, top-k 20) and the token budgets.
2. The run folder gets ``config.json`` (conditions and agents) and ``tasks.json`` (every
   task instance: seed, opponent, seat). Restarting in a folder checks that the
   conditions are the same; agents may be added.
3. Agents run one after another; each one's meta-episodes run concurrently, so their LLM
   calls share the engine's batches. Each distinct model is loaded once and its engine
   shared by every agent that uses it.
4. Every finished meta-episode is appended to ``records/<agent>/<env>.jsonl`` at once
   (flushed and fsynced). A restart skips the (task seed, rollout) pairs already there,
   so an interruption loses only the meta-episodes in flight.
5. Every LLM call samples with a seed derived from (task seed, rollout, call index):
   the agents meet common random numbers, and a meta-episode's samples do not depend
   on which others shared its batch or on whether the run was resumed.
6. :func:`mage_rl.eval.report.write_run_report` turns the records into
   ``results.json``, ``table.md`` and ``plots/``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mage_rl.envs import (
    ENV_NAMES,
    POPULATION_PRESETS,
    PROTOCOLS,
    SINGLE_AGENT_ENVS,
    Population,
    canonical_game,
    derive_seed,
    make_env,
    resolve_seat,
)
from mage_rl.fileio import atomic_write_json, atomic_write_lines
from mage_rl.graphs import GraphOptions, MetaEpisodeGraph, agent_graph
from mage_rl.policy.chat_model import SeededChatModel
from mage_rl.rl.records import MetaEpisodeRecord
from mage_rl.rl.rollout import TaskInstance, record_from_state, sample_tasks

log = logging.getLogger(__name__)

STYLES = ("react", "reflexion", "mage")
OPPONENT_SETS = ("train", "unseen")
GAME_SHORT = {"kuhn_poker": "kuhn", "tic_tac_toe": "ttt", "sokoban": "sokoban"}
_LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")
FORMAT_VERSION = 1


# -- agents ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSpec:
    """One agent under evaluation.

    Attributes:
        label: Its name in tables, plots and ``records/``.
        style: The graph that drives the model: ``react``, ``reflexion`` or ``mage``.
        model: ``tiny``, ``smollm2``, a local HF directory or ``.gguf`` file (e.g. a
            trained checkpoint), or an OpenAI-compatible endpoint URL.
        endpoint_model: The model name an endpoint serves (endpoints only).
    """

    label: str
    style: str
    model: str
    endpoint_model: str | None = None

    @property
    def is_endpoint(self) -> bool:
        return self.model.startswith(("http://", "https://"))


def parse_agents(
    texts: Sequence[str],
    default_model: str,
    endpoint: str | None = None,
    endpoint_model: str | None = None,
) -> list[AgentSpec]:
    """Parse ``STYLE[=MODEL][@LABEL]`` agent specs.

    ``MODEL`` defaults to ``default_model``; ``endpoint`` means the ``endpoint`` URL. The
    label defaults to the style, or ``STYLE:MODEL-NAME`` when two agents share a style.

    Raises:
        ValueError: An unknown style, ``endpoint`` without a URL, or two equal labels.
    """
    if not texts:
        raise ValueError("no agent to evaluate; pass e.g. --agent react --agent reflexion")
    parsed: list[tuple[str, str, str | None]] = []
    for text in texts:
        label = None
        head, at, tail = text.rpartition("@")
        if at and head and _LABEL.match(tail):
            text, label = head, tail
        style, _, model = text.partition("=")
        style = style.strip().lower()
        if style not in STYLES:
            raise ValueError(
                f"unknown agent style {style!r} in {text!r}; use STYLE[=MODEL][@LABEL] with "
                f"STYLE one of {', '.join(STYLES)}"
            )
        model = model.strip() or default_model
        if model == "endpoint":
            if not endpoint:
                raise ValueError(f"agent {text!r} needs --endpoint URL (and --endpoint-model)")
            model = endpoint
        if model.startswith(("http://", "https://")) and not endpoint_model:
            raise ValueError(f"agent {text!r} uses an endpoint; name its model: --endpoint-model")
        parsed.append((style, model, label))

    def short(model: str) -> str:
        if model.startswith(("http://", "https://")):
            return str(endpoint_model)
        return Path(model).name or model

    styles = [style for style, _, _ in parsed]
    agents = []
    for style, model, label in parsed:
        if label is None:
            label = style if styles.count(style) == 1 else f"{style}:{short(model)}"
        remote = model.startswith(("http://", "https://"))
        agents.append(AgentSpec(label, style, model, endpoint_model if remote else None))
    labels = [a.label for a in agents]
    for label in labels:
        if labels.count(label) > 1:
            raise ValueError(
                f"two agents are labelled {label!r}; name one with @LABEL, "
                f"e.g. --agent react=tiny@react-tiny"
            )
    for agent in agents:
        if agent.style == "mage" and agent.model in ("tiny", "smollm2"):
            log.warning(
                "agent %s drives the untrained %s with MAGE's graph; pass mage=CHECKPOINT "
                "to evaluate a trained model",
                agent.label,
                agent.model,
            )
    return agents


# -- conditions --------------------------------------------------------------------------


@dataclass
class EvalConfig:
    """What every agent of an evaluation shares, and the agents themselves."""

    agents: list[AgentSpec]
    """Agents to evaluate, run one after another (see :func:`parse_agents`)."""
    envs: list[str] = field(default_factory=lambda: ["kuhn_poker"])
    """Environments (``kuhn_poker``/``kuhn``, ``tic_tac_toe``/``ttt``); one column each
    in the paper's Table 1 layout."""
    opponents: str = "train"
    """Opponent set: ``train`` (the training populations, in-distribution), ``unseen``
    (Kuhn CFR, Tic-Tac-Toe MCTS-1000), a preset name or weighted specs."""
    n: int = 32
    """Task instances (seed, opponent, seat) per environment. The paper reports 128;
    more narrows the intervals (a rate's half-width is about 1/sqrt(n))."""
    rollouts: int = 1
    """Meta-episodes per task instance. Above 1 the intervals, which treat
    meta-episodes as independent, come out somewhat too narrow."""
    episodes: int = 3
    """K, episodes per meta-episode; success@k is reported for k = 1..K."""
    seed: int = 2026
    """Base seed of the task instances (kept apart from training seeds)."""
    seat: str = "sampled"
    """Agent seat: first, second or sampled (drawn from each task seed). Single-agent
    environments (Sokoban) always use their one seat, first."""
    protocol: str = "replay"
    """``replay`` restarts every episode from the same deal or board (the paper's
    protocol); ``fresh`` deals anew each episode against the same opponent."""
    stop_on_success: bool = True
    """End a meta-episode after a win, so success@k is Pass@k (authors' code). Turn off
    to play all K episodes, e.g. for ev@k on every meta-episode."""
    temperature: float = 0.7
    """Sampling temperature (the paper's evaluation: 0.7)."""
    top_p: float = 0.8
    """Nucleus truncation (paper: 0.8)."""
    top_k: int = 20
    """Top-k truncation (paper: 20; 0 disables it)."""
    max_tokens: int = 96
    """Token budget of a play turn; a longer answer is cut and usually invalid."""
    reflect_max_tokens: int | None = None
    """Token budget of a reflect turn (default: twice ``max_tokens``)."""
    max_turns: int | None = None
    """Agent turns per episode, invalid ones included (default: the game's)."""
    dtype: str = "auto"
    """Local models' compute dtype: auto, bf16 or fp32."""
    level: float = 0.95
    """Confidence level of the intervals."""
    concurrency: int = 16
    """Meta-episodes in flight at once (their LLM calls share batches)."""
    max_batch_size: int = 32
    """Most requests a local engine decodes together."""

    def __post_init__(self) -> None:
        self.envs = [canonical_game(e) for e in self.envs]
        for env in self.envs:
            if env not in ENV_NAMES:
                raise ValueError(f"no text environment {env!r}; valid: {', '.join(ENV_NAMES)}")
        if len(set(self.envs)) != len(self.envs):
            raise ValueError(f"an environment is listed twice: {self.envs}")
        checks = [
            ("n", self.n >= 1, "must be >= 1"),
            ("rollouts", self.rollouts >= 1, "must be >= 1"),
            ("episodes", 1 <= self.episodes <= 10, "must be in 1..10"),
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 disables it)"),
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
            ("level", 0 < self.level < 1, "must be in (0, 1), e.g. 0.95"),
            ("concurrency", self.concurrency >= 1, "must be >= 1"),
            ("max_batch_size", self.max_batch_size >= 1, "must be >= 1"),
            ("protocol", self.protocol in PROTOCOLS, f"must be one of {', '.join(PROTOCOLS)}"),
            ("dtype", self.dtype in ("auto", "bf16", "fp32"), "must be auto, bf16 or fp32"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} {rule}")
        if self.reflect_max_tokens is None:
            self.reflect_max_tokens = 2 * self.max_tokens
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns={self.max_turns} must be >= 1 (or unset)")
        resolve_seat(self.seat, 0)  # raises on an unknown seat
        for agent in self.agents:
            if agent.is_endpoint and not agent.endpoint_model:
                raise ValueError(f"endpoint agent {agent.label!r} needs --endpoint-model NAME")
            # Fail now, not after the agents before it have run for an hour.
            local = not agent.is_endpoint and agent.model not in ("tiny", "smollm2")
            if local and not Path(agent.model).expanduser().exists():
                raise ValueError(
                    f"agent {agent.label!r}: model {agent.model!r} does not exist; use tiny, "
                    "smollm2, a local HF directory or .gguf file, or an endpoint URL"
                )
        for env in self.envs:
            opponent_population(self.opponents, env)  # raises on a bad opponent set

    def conditions(self) -> dict[str, Any]:
        """Everything that must match for results to be comparable (and to resume)."""
        skip = {"agents", "concurrency", "max_batch_size"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    def graph_options(self) -> GraphOptions:
        """The meta-episode options shared by every agent (the style adjusts the rest)."""
        return GraphOptions(
            num_episodes=self.episodes,
            context="reflection",
            protocol=self.protocol,
            stop_on_success=self.stop_on_success,
            max_tokens=self.max_tokens,
            reflect_max_tokens=int(self.reflect_max_tokens or 2 * self.max_tokens),
        )


def opponent_population(opponents: str, env: str) -> Population:
    """The population named by an opponent set for one environment.

    ``train`` and ``unseen`` name the SPEC §7 presets of each game (``kuhn_train``,
    ``ttt_unseen``...); anything else is a preset name or weighted specs.

    Raises:
        ValueError: A spec that does not play ``env``, or an unknown name.
    """
    if opponents in OPPONENT_SETS:
        return POPULATION_PRESETS[f"{GAME_SHORT[env]}_{opponents}"]
    try:
        population = Population.parse(opponents, game=env)
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    for spec in population.specs:
        if canonical_game(spec.split(":")[0]) != env:
            raise ValueError(
                f"opponent {spec!r} does not play {env}; use --opponents train or unseen, "
                "or evaluate each environment in its own run"
            )
    return population


def eval_tasks(cfg: EvalConfig) -> dict[str, list[TaskInstance]]:
    """The task instances of every environment: the same for every agent."""
    return {
        env: sample_tasks(
            opponent_population(cfg.opponents, env),
            cfg.n,
            base_seed=cfg.seed,
            seat="first" if env in SINGLE_AGENT_ENVS else cfg.seat,
        )
        for env in cfg.envs
    }


# -- run folder --------------------------------------------------------------------------


def tasks_document(cfg: EvalConfig, tasks: dict[str, list[TaskInstance]]) -> dict[str, Any]:
    """``tasks.json``: per environment the population and every task instance."""
    out = {}
    for env, items in tasks.items():
        population = opponent_population(cfg.opponents, env)
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
        diffs = [
            f"{key}: {old.get(key)!r} -> {new.get(key)!r}"
            for key in sorted(set(old) | set(new))
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
            if prior is not None and prior != agent:
                raise ValueError(
                    f"{out} already has agent {agent.label!r} as {prior.style}={prior.model}, "
                    f"not {agent.style}={agent.model}; give the new one another @LABEL"
                )
        agents = saved_agents + [a for a in cfg.agents if a.label not in by_label]
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


# -- playing -----------------------------------------------------------------------------


async def play_tasks(
    graph: MetaEpisodeGraph,
    policy: Any,
    cfg: EvalConfig,
    env_name: str,
    jobs: Sequence[tuple[TaskInstance, int]],
    label: str,
    on_done: Callable[[MetaEpisodeRecord], None],
) -> None:
    """Play the (task, rollout) ``jobs`` concurrently; ``on_done`` gets each record as
    soon as its meta-episode ends."""
    gate = asyncio.Semaphore(cfg.concurrency)

    async def one(task: TaskInstance, rollout: int) -> None:
        async with gate:
            llm = SeededChatModel(
                policy=policy,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                max_tokens=cfg.max_tokens,
                sample_seed=derive_seed("eval-sample", task.seed, rollout),
            )
            env = make_env(env_name, task.opponent, seat=task.seat, max_turns=cfg.max_turns)
            state = await graph.run(env, llm, task_seed=task.seed, opponent=task.opponent)
        record = record_from_state(
            state, task=task, rollout=rollout, env_name=env_name, agent=label
        )
        on_done(record)

    try:
        await asyncio.gather(*(one(t, r) for t, r in jobs))
    finally:
        aclose = getattr(policy, "aclose", None)
        if aclose is not None:  # endpoint clients belong to this event loop
            await aclose()


class _Policies:
    """Each distinct model loaded once; its engine shared by the agents that use it."""

    def __init__(self, cfg: EvalConfig) -> None:
        self.cfg = cfg
        self._loaded: dict[str, Any] = {}

    def get(self, agent: AgentSpec) -> Any:
        key = f"{agent.model}#{agent.endpoint_model}" if agent.is_endpoint else agent.model
        if key not in self._loaded:
            if agent.is_endpoint:
                from mage_rl.policy.openai_client import OpenAIPolicy

                policy: Any = OpenAIPolicy(agent.model, str(agent.endpoint_model))
            else:
                from mage_rl.config import PolicyConfig
                from mage_rl.runtime import build_engine

                log.info("loading model %s", agent.model)
                settings = {
                    "model": agent.model,
                    "dtype": self.cfg.dtype,
                    "max_batch_size": self.cfg.max_batch_size,
                }
                policy = build_engine(PolicyConfig.model_validate(settings))
            self._loaded[key] = policy
        return self._loaded[key]

    def close(self) -> None:
        for policy in self._loaded.values():
            close = getattr(policy, "close", None)
            if close is not None:
                close()
        self._loaded.clear()


def run_evaluation(
    cfg: EvalConfig,
    out_dir: str | Path,
    *,
    progress: bool = True,
    on_record: Callable[[MetaEpisodeRecord], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) an evaluation and write its report.

    Args:
        cfg: Conditions and agents.
        out_dir: The run folder; an existing one is resumed.
        progress: Show a progress bar per (agent, environment).
        on_record: Called with each record after it is saved.

    Returns:
        The run's results (as written to ``results.json``).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from mage_rl.eval.report import write_run_report

    out = Path(out_dir)
    tasks = eval_tasks(cfg)
    prepare_run_dir(out, cfg, tasks)
    total = cfg.n * cfg.rollouts
    plan = []
    for agent in cfg.agents:
        for env in cfg.envs:
            logfile = RecordLog(records_path(out, agent.label, env))
            done = {(r.seed, r.rollout) for r in logfile.read()}
            jobs = [
                (t, r) for t in tasks[env] for r in range(cfg.rollouts) if (t.seed, r) not in done
            ]
            plan.append((agent, env, logfile, jobs))
    policies = _Policies(cfg)
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, disable=not progress) as bar:
            bars = {
                (agent.label, env): bar.add_task(
                    f"{agent.label} {env}", total=total, completed=total - len(jobs)
                )
                for agent, env, _, jobs in plan
            }
            for agent, env, logfile, jobs in plan:
                if not jobs:
                    continue
                if len(jobs) < total:
                    log.info("%s %s: resuming, %d of %d left", agent.label, env, len(jobs), total)
                bar_id = bars[(agent.label, env)]

                def save(record: MetaEpisodeRecord, logfile=logfile, bar_id=bar_id) -> None:
                    logfile.append(slim(record))
                    bar.advance(bar_id)
                    if on_record is not None:
                        on_record(record)

                graph = agent_graph(agent.style, cfg.graph_options())
                policy = policies.get(agent)
                asyncio.run(play_tasks(graph, policy, cfg, env, jobs, agent.label, save))
    finally:
        policies.close()
    return write_run_report(out)
