"""The conditions of ``mage eval``: settings checked, opponents resolved, tasks drawn.

:class:`EvalConfig` is :class:`~mage_rl.eval.settings.EvalSettings` (the one definition
of every setting) plus the agents, checked on construction. :func:`eval_tasks` draws the
task instances once from the base seed, so every agent meets the same seeds, opponents
and seats.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mage_rl.envs import (
    ENV_NAMES,
    POPULATION_PRESETS,
    PROTOCOLS,
    SINGLE_AGENT_ENVS,
    Population,
    canonical_game,
    resolve_seat,
)
from mage_rl.envs.names import GAME_SHORT
from mage_rl.eval.agents import AgentSpec
from mage_rl.eval.settings import EvalSettings
from mage_rl.graphs.rollouts import TaskInstance, sample_tasks
from mage_rl.players.play_settings import (
    PLAY_KEYS,
    agent_config,
    population_text,
    resolve_conditions,
    resolve_play,
)

if TYPE_CHECKING:
    from mage_rl.config import RunConfig

OPPONENT_SETS = ("train", "unseen")


@dataclass(kw_only=True)
class EvalConfig(EvalSettings):
    """What every agent of an evaluation shares (:class:`EvalSettings`), and the agents.

    Every field is a keyword. On construction the conditions left unset are taken from
    the agents' runs (:func:`~mage_rl.players.play_settings.resolve_conditions`), every agent gets
    its play settings (:func:`~mage_rl.players.play_settings.resolve_play`), and the checks run;
    they raise ``ValueError`` with the value, the rule and the fix.
    """

    agents: list[AgentSpec]
    """Agents to evaluate, run one after another (see :func:`parse_agents`)."""

    def __post_init__(self) -> None:
        for name, value in resolve_conditions(self, self.agents).items():
            setattr(self, name, value)
        self.envs = [canonical_game(e) for e in self.envs or ()]
        for env in self.envs:
            if env not in ENV_NAMES:
                raise ValueError(f"no text environment {env!r}; valid: {', '.join(ENV_NAMES)}")
        if len(set(self.envs)) != len(self.envs):
            raise ValueError(f"an environment is listed twice: {self.envs}")
        checks = [
            ("n", self.n >= 1, "must be >= 1"),
            ("rollouts", self.rollouts >= 1, "must be >= 1"),
            ("episodes", 1 <= int(self.episodes or 0) <= 10, "must be in 1..10"),
            ("temperature", self.temperature >= 0, "must be >= 0"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", self.top_k >= 0, "must be >= 0 (0 disables it)"),
            ("max_tokens", self.max_tokens is None or self.max_tokens >= 1, "must be >= 1"),
            ("max_turns", self.max_turns is None or self.max_turns >= 1, "must be >= 1"),
            ("level", 0 < self.level < 1, "must be in (0, 1), e.g. 0.95"),
            ("concurrency", self.concurrency >= 1, "must be >= 1"),
            ("max_batch_size", self.max_batch_size >= 1, "must be >= 1"),
            ("protocol", self.protocol in PROTOCOLS, f"must be one of {', '.join(PROTOCOLS)}"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r} {rule}")
        resolve_seat(str(self.seat), 0)  # raises on an unknown seat
        self.agents = [resolve_play(agent, self) for agent in self.agents]
        for agent in self.agents:
            if agent.play["constrain_actions"] and (agent.style == "react" or agent.is_endpoint):
                raise ValueError(
                    f"agent {agent.label!r}: constrained decoding leaves no room for "
                    "ReAct's Thought line and needs a local model; evaluate it with "
                    "--no-constrain-actions"
                )
            if agent.is_endpoint and not agent.endpoint_model:
                raise ValueError(f"endpoint agent {agent.label!r} needs --endpoint-model NAME")
            # Fail now, not after the agents before it have run for an hour.
            local = not agent.is_endpoint and agent.model.split(":")[0] not in ("tiny", "smollm2")
            if local and not Path(agent.model).expanduser().exists():
                raise ValueError(
                    f"agent {agent.label!r}: model {agent.model!r} does not exist; use tiny, "
                    "smollm2, a local HF directory or .gguf file, a training run, or an "
                    "endpoint URL"
                )
        for env in self.envs:
            opponent_population(str(self.opponents), env)  # raises on a bad opponent set
            for agent in self.agents:
                self.agent_config(agent, env)  # raises where a run-config rule breaks

    def conditions(self) -> dict[str, Any]:
        """Everything all agents share that must match for results to be comparable (and
        to resume); how each agent plays is recorded with the agent."""
        skip = {"agents", "concurrency", "max_batch_size", *PLAY_KEYS}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}

    def agent_config(self, agent: AgentSpec, env: str) -> RunConfig:
        """The run config ``agent`` plays ``env`` from
        (:func:`~mage_rl.players.play_settings.agent_config`)."""
        population = opponent_population(str(self.opponents), env)
        text = population_text(population.specs, [float(w) for w in population.weights])
        return agent_config(agent, env, self, text)


def opponent_population(opponents: str, env: str) -> Population:
    """The population named by an opponent set for one environment.

    ``train`` and ``unseen`` name the SPEC §7 presets of each game (``kuhn_train``,
    ``ttt_unseen``...); anything else is a preset name or weighted specs.

    Raises:
        ValueError: A spec that does not play ``env``, or an unknown name.
    """
    if opponents in OPPONENT_SETS:
        preset = f"{GAME_SHORT.get(env, env)}_{opponents}"
        if preset not in POPULATION_PRESETS:
            raise ValueError(
                f"--opponents {opponents} means the preset {preset!r}, which {env} does not "
                f"register; register it with register_population({preset!r}, ...) or pass "
                "weighted specs"
            )
        return POPULATION_PRESETS[preset]
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
            opponent_population(str(cfg.opponents), env),
            cfg.n,
            base_seed=cfg.seed,
            seat="first" if env in SINGLE_AGENT_ENVS else str(cfg.seat),
        )
        for env in cfg.envs or ()
    }
