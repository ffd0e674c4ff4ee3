"""The conditions of ``mage eval``: settings checked, opponents resolved, tasks drawn.

:class:`EvalConfig` is :class:`~mage_rl.eval.settings.EvalSettings` (the one definition
of every setting) plus the agents, checked on construction. :func:`eval_tasks` draws the
task instances once from the base seed, so every agent meets the same seeds, opponents
and seats.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from mage_rl.envs import (
    ENV_NAMES,
    POPULATION_PRESETS,
    PROTOCOLS,
    SINGLE_AGENT_ENVS,
    Population,
    canonical_game,
    resolve_seat,
)
from mage_rl.eval.agents import AgentSpec
from mage_rl.eval.settings import EvalSettings
from mage_rl.graphs import GraphOptions
from mage_rl.rl.rollout import TaskInstance, sample_tasks

OPPONENT_SETS = ("train", "unseen")
GAME_SHORT = {
    "kuhn_poker": "kuhn",
    "tic_tac_toe": "ttt",
    "sokoban": "sokoban",
    "leduc_poker": "leduc",
    "textworld_express": "twx",
}


@dataclass(kw_only=True)
class EvalConfig(EvalSettings):
    """What every agent of an evaluation shares (:class:`EvalSettings`), and the agents.

    Every field is a keyword; the checks run on construction and raise ``ValueError``
    with the value, the rule and the fix.
    """

    agents: list[AgentSpec]
    """Agents to evaluate, run one after another (see :func:`parse_agents`)."""

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
        if self.prompt not in ("standard", "compact"):
            raise ValueError(f"prompt={self.prompt!r} must be standard or compact")
        if self.answer_lead and not self.constrain_actions:
            raise ValueError("answer_lead needs constrain_actions (the lead is forced)")
        if self.constrain_actions:
            for agent in self.agents:
                if agent.style == "react" or agent.is_endpoint:
                    raise ValueError(
                        f"agent {agent.label!r}: constrained decoding leaves no room for "
                        "ReAct's Thought line and needs a local model; evaluate it without "
                        "--constrain-actions"
                    )
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
            prompt=self.prompt,
            constrain_actions=self.constrain_actions,
            answer_lead=self.answer_lead,
        )


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
            opponent_population(cfg.opponents, env),
            cfg.n,
            base_seed=cfg.seed,
            seat="first" if env in SINGLE_AGENT_ENVS else cfg.seat,
        )
        for env in cfg.envs
    }
