"""How each agent of ``mage eval`` plays: one run config per agent, read from its run.

An agent whose model is a training run (the run folder, one of its checkpoints, or the
checkpoint's ``model`` folder) plays in the format it was trained in: the run's
``config.yaml`` gives its graph, plugins, layout, context, prompt, constrained decoding,
token limit, stop rule, turn limit, dtype and engine (:data:`PLAY_KEYS`). A
flag of ``mage eval`` overrides the run's value; the override is recorded with the agent
and listed in the report. An agent without a run plays the flags' values, or
:func:`play_defaults`.

The shared conditions (environment, opponents, K, protocol, seat) default to the runs'
values too, when every run agrees (:func:`resolve_conditions`). Every agent is then
played from a :class:`~mage_rl.config.RunConfig` (:func:`agent_config`), the object
``mage train`` and ``mage rollout`` build their graphs and engines from, so a setting
means the same thing in every command.
"""

from __future__ import annotations

import copy
import functools
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from mage_rl.config import RunConfig
from mage_rl.config_yaml import BASE_DIR_KEY, describe_error, parse_overrides, read_yaml, set_path
from mage_rl.envs import Population, env_spec
from mage_rl.envs.llm_opponent import without_self
from mage_rl.envs.names import canonical_game
from mage_rl.train_folder import CONFIG_FILE, find_run

if TYPE_CHECKING:
    from mage_rl.eval.agents import AgentSpec

logger = logging.getLogger(__name__)

PLAY_KEYS: dict[str, str] = {
    "agent": "meta.agent",
    "plugins": "plugins",
    "engine": "policy.engine",
    "dtype": "policy.dtype",
    "layout": "meta.layout",
    "context": "meta.context",
    "prompt": "meta.prompt",
    "constrain_actions": "policy.constrain_actions",
    "max_tokens": "policy.max_tokens",
    "max_turns": "env.max_turns",
    "stop_on_success": "meta.stop_on_success",
}
"""An agent's play settings: their names in ``mage eval`` (a flag where one exists,
``--max-tokens`` for ``max_tokens``) and the run-config key each one is."""

CONDITION_KEYS: dict[str, str] = {
    "envs": "env.name",
    "opponents": "env.population",
    "episodes": "meta.episodes",
    "protocol": "env.protocol",
    "seat": "env.seat",
}
"""Shared conditions that default to the agents' runs, and the run-config key of each."""


@functools.cache
def _run_defaults() -> dict[str, Any]:
    return RunConfig().model_dump(mode="json")


def run_default(key: str) -> Any:
    """The default of a run-config key (``"meta.layout"`` -> ``"rerendered"``): what an
    agent without a training run plays with."""
    return copy.deepcopy(get_path(_run_defaults(), key))


def condition_defaults() -> dict[str, Any]:
    """The conditions of an evaluation whose agents have no run: the run config's
    defaults, except the opponents, which are the training set of each game."""
    out = {name: run_default(key) for name, key in CONDITION_KEYS.items()}
    out["envs"] = [out["envs"]]
    out["opponents"] = "train"
    return out


GRAPH_CONTEXT = {"react": "none", "reflexion": "reflection"}
"""The context these built-in graphs fix whatever they are given."""


def play_defaults(style: str) -> dict[str, Any]:
    """The play settings of an agent that has no training run."""
    play = {name: run_default(key) for name, key in PLAY_KEYS.items()}
    play["agent"] = style
    play["context"] = GRAPH_CONTEXT.get(style, play["context"])
    return play


def get_path(data: dict[str, Any], dotted: str) -> Any:
    """``get_path({"a": {"b": 1}}, "a.b") == 1``; ``None`` where a key is missing."""
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


@functools.cache
def _saved_config(run_dir: str) -> dict[str, Any]:
    path = Path(run_dir) / CONFIG_FILE
    raw = read_yaml(path)
    # Only the sections that say how the agent plays; the training sections of an older
    # run may name settings this version no longer has, and play does not need them.
    data = {key: raw[key] for key in RunConfig.model_fields if key in raw}
    # Settings an older version wrote and this one removed are dropped, and named.
    dropped = []
    for key, value in data.items():
        section = RunConfig.model_fields[key].annotation
        if isinstance(value, dict) and isinstance(section, type) and issubclass(section, BaseModel):
            gone = sorted(set(value) - set(section.model_fields))
            dropped += [f"{key}.{name}={value[name]!r}" for name in gone]
            data[key] = {k: v for k, v in value.items() if k not in gone}
    if dropped:
        logger.warning("training run %s: this version has no %s; played without them",
                       run_dir, ", ".join(dropped))  # fmt: skip
    data[BASE_DIR_KEY] = run_dir
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        lines = "\n".join(describe_error(err, RunConfig) for err in exc.errors())
        raise ValueError(
            f"training run {run_dir}: its {CONFIG_FILE} does not load:\n{lines}"
        ) from None
    return cfg.model_dump(mode="json")


def run_config(run_dir: str | Path) -> dict[str, Any]:
    """The play part of a run's saved config (``plugins``, ``env``, ``meta``, ``policy``,
    ``rollout``) as plain data; loading it loads the run's plugins."""
    return copy.deepcopy(_saved_config(str(Path(run_dir).resolve())))


def run_play(run_dir: str | Path) -> dict[str, Any]:
    """The play settings (:data:`PLAY_KEYS`) a run was trained with."""
    data = run_config(run_dir)
    return {name: get_path(data, key) for name, key in PLAY_KEYS.items()}


def resolve_conditions(settings: Any, agents: list[AgentSpec]) -> dict[str, Any]:
    """The conditions :data:`CONDITION_KEYS` left unset, from the agents' runs.

    Raises:
        ValueError: Two runs disagree on an unset condition (the message names the flag).
    """
    configs = {a.label: run_config(a.run) for a in agents if a.run}
    out: dict[str, Any] = {}
    for name, key in CONDITION_KEYS.items():
        if getattr(settings, name) is not None:
            continue
        if name == "opponents":
            envs = [canonical_game(e) for e in out.get("envs") or settings.envs]
            trained = {get_path(c, "env.name") for c in configs.values()}
            if envs != sorted(trained):  # the runs' populations play another game
                out[name] = condition_defaults()[name]
                continue
        values = {label: get_path(c, key) for label, c in configs.items()}
        distinct = {repr(v) for v in values.values()}
        if len(distinct) > 1:
            flag = "--env" if name == "envs" else "--" + name
            listed = ", ".join(f"{label}: {v}" for label, v in values.items())
            raise ValueError(
                f"the agents' runs differ in {key} ({listed}); say which to use with {flag}"
            )
        if not values:
            out[name] = condition_defaults()[name]
        else:
            value = next(iter(values.values()))
            if name == "opponents":  # a self-play run is evaluated against the rest
                value = _without_self(value, next(iter(configs.values())))
            out[name] = [value] if name == "envs" else value
    return out


def resolve_play(agent: AgentSpec, settings: Any) -> AgentSpec:
    """``agent`` with its play settings: its run's (or the defaults), then the flags.

    A flag that changes a run's value is recorded in ``agent.overridden`` (setting ->
    the run's value), and so is a graph other than the run's. A graph that fixes its
    context (ReAct, Reflexion) keeps it.
    """
    base = run_play(agent.run) if agent.run else play_defaults(agent.style)
    play, overridden = dict(base), {}
    if agent.run and agent.style != base["agent"]:
        play["agent"], overridden["agent"] = agent.style, base["agent"]
    for name in PLAY_KEYS:
        value = getattr(settings, name, None)
        if value is not None and value != base[name]:
            play[name] = value
            if agent.run:
                overridden[name] = base[name]
    if play["agent"] in GRAPH_CONTEXT:
        play["context"] = GRAPH_CONTEXT[play["agent"]]
        overridden.pop("context", None)
    return replace(agent, play=play, overridden=overridden)


def _without_self(population: str, config: dict[str, Any]) -> str:
    """A run's ``env.population`` without ``GAME:self``."""
    parsed = Population.parse(population, game=get_path(config, "env.name"))
    kept = without_self(parsed)
    if kept is None:
        raise ValueError(
            f"the run trained against itself alone (env.population={population!r}); say which "
            "opponents to evaluate against with --opponents"
        )
    return population if kept is parsed else population_text(kept.specs, list(kept.weights))


def population_text(specs: list[str], weights: list[float]) -> str:
    """A population as ``env.population`` spells it: ``spec=w,spec=w``."""
    return ",".join(f"{s}={float(w)!r}" for s, w in zip(specs, weights, strict=True))


def agent_config(agent: AgentSpec, env: str, settings: Any, population: str) -> RunConfig:
    """The run config ``agent`` plays ``env`` from: its run's saved config (or the
    defaults) with its play settings, the shared conditions, its model, and no
    exploration (an evaluation samples the policy itself).

    Raises:
        ValueError: The settings break a rule of the run config (the key is named).
    """
    data = run_config(agent.run) if agent.run else {}
    data.pop("rollout", None)
    values = {key: agent.play[name] for name, key in PLAY_KEYS.items()}
    values |= {
        "env.name": env,
        "env.population": population,
        "env.seat": "first" if env_spec(env).single_agent else settings.seat,
        "env.protocol": settings.protocol,
        "meta.episodes": settings.episodes,
        "policy.model": agent.model,
        "policy.max_batch_size": settings.max_batch_size,
        "policy.explore": 0.0,
    }
    for key, value in values.items():
        set_path(data, key, value)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        lines = "\n".join(describe_error(err, RunConfig) for err in exc.errors())
        raise ValueError(f"agent {agent.label!r} cannot play {env} so:\n{lines}") from None


def trained_config(run: str | Path, overrides: list[str] | None = None) -> tuple[Path, RunConfig]:
    """The run folder of ``run`` (a run folder, one of its checkpoints or a checkpoint's
    ``model`` folder) and the config its agent plays with: the run's ``config.yaml`` with
    ``policy.model`` set to the checkpoint, no exploration, and ``overrides``
    (``key=value``) applied. ``mage serve RUN --agent`` and :func:`mage_rl.load_agent`
    use it, as ``mage eval --agent NAME=RUN`` uses the run config.

    Raises:
        ValueError: ``run`` is no training run, or an override breaks a config rule.
    """
    found = find_run(str(run))
    if found is None:
        raise ValueError(
            f"{run} is not a training run: give its folder (it holds config.yaml and "
            "checkpoints/) or one of its checkpoints"
        )
    run_dir, model_dir = found
    data = run_config(run_dir)
    set_path(data, "policy.model", str(model_dir))
    set_path(data, "policy.explore", 0.0)
    for key, value in parse_overrides(list(overrides or [])):
        set_path(data, key, value)
    return Path(run_dir), RunConfig.model_validate(data)
