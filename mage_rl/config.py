"""Typed configuration loaded from YAML.

Every section is a pydantic model that rejects unknown keys, so a typo fails at load
time with the key's name (and the valid keys of its section) instead of being silently
ignored. Types are strict: ``true`` is not a number, ``1`` is not a boolean and ``2.5``
is not an integer (an integer is a float, and ``1e-4`` reads as a float). Cross-field
rules are checked on load with a message that says how to fix them. ``--set a.b=value``
overrides are applied to the raw YAML mapping before validation, so they are checked the
same way. A config file must name its model (``policy.model``), and a model path must
exist. Every error names the dotted key and where its value came from: the file and
line, or the ``--set`` that gave it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from mage_rl.config_yaml import (
    BASE_DIR_KEY,
    Sources,
    describe_error,
    key_lines,
    parse_overrides,
    read_yaml,
    set_path,
    with_plugins_loaded,
)
from mage_rl.policy.model_specs import model_spec_problem
from mage_rl.sections import (
    AdvantageConfig,
    EvalSection,
    LeagueSection,
    LearnerConfig,
    OpenRLHFSection,
    ReturnConfig,
    Section,
)

ContextMode = Literal["reflection", "history", "history+reflection", "none"]


class EnvConfig(Section):
    """The task and its opponents."""

    name: str = Field(
        "kuhn_poker",
        description="Environment: a registered name or alias (kuhn_poker, tic_tac_toe, "
        "sokoban, scienceworld, textworld_express, or one a plugin registers); stored as "
        "its canonical name.",
    )
    population: str = Field(
        "kuhn_train",
        description="Opponents: a preset (kuhn_train, ttt_train, kuhn_unseen, ttt_unseen) "
        "or weighted specs such as 'kuhn:aggressive=0.5,kuhn:conservative=0.5'. Sokoban "
        "names room variants here: sokoban_train (2 boxes), sokoban_unseen, sokoban:boxes:N; "
        "the text worlds name task variants: scienceworld_train, twx_train, "
        "scienceworld:TASK:SPLIT, twx:GAME:SPLIT[:small].",
    )
    seat: str = Field(
        "sampled",
        description="Agent seat: first, second, or sampled (drawn from the task seed; "
        "the paper samples the Tic-Tac-Toe seat).",
    )
    protocol: Literal["replay", "fresh"] = Field(
        "replay",
        description="Episode protocol (SPEC §2): replay restarts every episode from the "
        "same deal/board (paper-faithful); fresh deals anew each episode, same opponent.",
    )
    max_turns: int | None = Field(
        None, ge=1, description="Agent turns per episode, invalid ones included (game default)."
    )


class MetaEpisodeConfig(Section):
    """How a meta-episode is played (SPEC §2)."""

    episodes: int = Field(3, ge=1, le=10, description="K, episodes per meta-episode.")
    context: ContextMode = Field(
        "reflection",
        description="What earlier episodes put into the play prompt: reflection (the "
        "paper's default), history (past moves and outcomes), history+reflection, or "
        "none (each episode alone, as ReAct).",
    )
    stop_on_success: bool = Field(
        True,
        description="Stop the meta-episode after a won episode (authors' code; Pass@k "
        "assumes it). Turn off to always play K episodes, e.g. to measure EV per episode.",
    )
    agent: str = Field(
        "mage",
        description="A registered agent graph: mage and reflexion answer directly with a "
        "tag, react reasons in a Thought line before the tag; a plugin's agent "
        "(register_agent) plays its own graph inside the meta-episode.",
    )
    layout: Literal["rerendered", "conversation"] = Field(
        "rerendered",
        description="Prompt layout (SPEC §2): rerendered (every call a fresh prompt; the "
        "paper's) or conversation (the meta-episode is one chat of token ids, trained as one "
        "sequence: far fewer learner tokens; local engine only).",
    )
    prompt: Literal["standard", "compact"] = Field(
        "standard",
        description="Play-prompt template: standard (full rules, for instruction-tuned "
        "models) or compact (brief rules, one line per past episode; for small models).",
    )


class PolicyConfig(Section):
    """The model and how it samples."""

    model: str = Field(
        "smollm2",
        description="tiny (in-process test model), smollm2 (embedded default) "
        "or a path to an HF causal-LM directory or checkpoint.",
    )
    dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto uses bf16 where the CPU supports it, else fp32."
    )
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (training: 1.0).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus truncation.")
    top_k: int = Field(0, ge=0, description="Top-k truncation; 0 disables it.")
    max_tokens: int = Field(
        96, ge=1, description="L_max, the response-length limit; also sets the length penalty."
    )
    max_batch_size: int = Field(
        32, ge=1, description="Most concurrent requests the local engine puts in one forward pass."
    )
    constrain_actions: bool = Field(
        False,
        description="Constrained decoding on play turns: sample only <action>A</action> for "
        "a legal action A, from the model's distribution restricted to those strings; the "
        "learner scores the same restricted distribution. Local engine only.",
    )
    explore: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="With constrain_actions, training rollouts only: sample each choice "
        "from (1 - explore) * policy + explore * uniform over the allowed tokens and record "
        "that mixture's log-probs (docs/policy.md). Evaluation never explores.",
    )  # fmt: skip
    engine: Literal["local", "vllm"] = Field(
        "local",
        description="local: the batched engine in this process; vllm: a vLLM server that "
        "mage starts (from .venv-vllm on a CPU) and pushes the weights to after every update "
        "(docs/policy.md). Not with tiny, nor with constrain_actions.",
    )

    @model_validator(mode="after")
    def _check_engine(self) -> PolicyConfig:
        if self.explore > 0 and not self.constrain_actions:
            raise ValueError(
                f"policy.explore={self.explore} mixes uniform choices into constrained "
                "answers only; set policy.constrain_actions: true or policy.explore: 0"
            )
        if self.engine == "vllm" and (self.model.split(":")[0] == "tiny" or self.constrain_actions):
            raise ValueError(
                f"policy.engine=vllm with model={self.model!r}, constrain_actions="
                f"{self.constrain_actions}: vLLM loads a directory (the tiny model exists only "
                "in-process) and returns no allowed tokens per position (constrained decoding); "
                "use smollm2 or an HF path, constrain_actions: false, or policy.engine: local"
            )
        return self


class RolloutConfig(Section):
    """How many meta-episodes are collected per batch."""

    tasks: int = Field(4, ge=1, description="B, task instances (seed, opponent, seat) per batch.")
    group_size: int = Field(
        4, ge=1, description="G, rollouts per task instance (the GiGPO group; paper: 8)."
    )
    concurrency: int = Field(
        16, ge=1, description="Meta-episodes running at once (their LLM calls share batches)."
    )
    seed: int = Field(0, description="Base seed; task seeds derive from it and the iteration.")
    opponents: Literal["balanced", "independent"] = Field(
        "balanced",
        description="A training batch's opponents: balanced (each in proportion to its "
        "weight, up to one task) or independent (each task draws its own).",
    )


class RunConfig(Section):
    """A rollout or evaluation experiment: task, meta-episode, policy, batch size."""

    plugins: list[str] = Field(
        default_factory=list,
        description="Plugins loaded before the rest is checked: module names or .py files "
        "(relative to the config file) that register environments, opponents or agents.",
    )
    env: EnvConfig = Field(default_factory=EnvConfig)
    meta: MetaEpisodeConfig = Field(default_factory=MetaEpisodeConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    # Where load_config read each value, for errors found after loading (see locate).
    _sources: Sources | None = PrivateAttr(default=None)

    def locate(self, key: str, line: str) -> str:
        """``line``, an error about ``key``, with where the value came from (the file
        and line or the ``--set``) when the config was read by :func:`load_config`."""
        if self._sources is None:
            return line
        return self._sources.locate([tuple(key.split("."))], line)

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, data: Any) -> Any:
        return with_plugins_loaded(data)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        from mage_rl.envs import POPULATION_PRESETS, Population, canonical_game
        from mage_rl.envs.opponents import WeightError
        from mage_rl.envs.registry import seat_problem
        from mage_rl.graphs import AGENT_GRAPHS

        self.env.name = canonical_game(self.env.name)
        AGENT_GRAPHS.canonical(self.meta.agent)
        try:
            population = Population.parse(self.env.population, game=self.env.name)
        except WeightError as exc:
            raise ValueError(f"env.population={self.env.population!r}: {exc}") from None
        except (ValueError, KeyError) as exc:
            raise ValueError(
                f"env.population={self.env.population!r} is neither a preset "
                f"({', '.join(POPULATION_PRESETS.names())}) nor a list of opponent specs: "
                f"{str(exc).strip(chr(34) + chr(39))}"
            ) from None
        for spec in population.specs:
            if canonical_game(spec.split(":")[0]) != self.env.name:
                raise ValueError(
                    f"env.population has {spec!r}, which does not play env.name="
                    f"{self.env.name!r}; use opponents of {self.env.name}"
                )
        problem = seat_problem(self.env.name, self.env.seat)
        if problem:
            raise ValueError(problem)
        if (
            self.meta.layout == "conversation"
            and self.meta.context == "none"
            and self.meta.episodes > 1
        ):
            raise ValueError(
                "meta.layout=conversation keeps every earlier episode in the one chat, so "
                "meta.context=none cannot hold; set meta.layout: rerendered for that"
            )
        if self.meta.agent == "react" and self.meta.context != "none":
            raise ValueError(
                f"meta.agent=react keeps no memory across episodes, but meta.context="
                f"{self.meta.context!r}; set meta.context: none"
            )
        if self.meta.agent == "react" and self.policy.constrain_actions:
            raise ValueError(
                "policy.constrain_actions leaves room only for the action tag, so the ReAct "
                "Thought line cannot be written; use meta.agent: mage or reflexion"
            )
        return self


def load_config(
    path: str | Path | None,
    overrides: list[str] | None = None,
    cls: type[BaseModel] | None = None,
) -> Any:
    """Load and validate a YAML config, with ``key=value`` overrides applied first.

    The one schema is :class:`TrainConfig` (every command reads it; the training
    sections are optional). ``cls=RunConfig`` checks a file against the play sections
    alone, refusing the training ones.

    A file must set ``policy.model`` (in the file or by an override): a config that
    forgets its model would otherwise train the default one.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: A YAML syntax error or duplicate key (file and line named), an empty
            file, no ``policy.model``, an unknown key (the section's valid keys listed), a
            bad value or a broken cross-field rule; the message names the key.
    """
    cls = TrainConfig if cls is None else cls
    data: dict[str, Any] = {}
    sources = Sources()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file {path} does not exist")
        data = read_yaml(path)
        sources = Sources(path, key_lines(path))
    items = overrides or []
    for item, (key, value) in zip(items, parse_overrides(items), strict=True):
        set_path(data, key, value)
        sources.overrides[tuple(key.split("."))] = item.strip()
    policy = data.get("policy")
    named = isinstance(policy, dict) and "model" in policy
    if path is not None and "policy" in cls.model_fields and not named:
        raise ValueError(
            f"{path} does not name its model: add 'policy:' with 'model: tiny', "
            "'model: smollm2' or 'model: PATH/TO/HF_MODEL' (or --set policy.model=...)"
        )
    if path is not None:
        data[BASE_DIR_KEY] = str(Path(path).resolve().parent)
    try:
        cfg = cls.model_validate(data)
    except ValidationError as exc:
        lines = [describe_error(err, cls, sources) for err in exc.errors()]
        training = sorted(set(data) & (set(TrainConfig.model_fields) - set(cls.model_fields)))
        if cls is RunConfig and training:
            lines.append(
                f"  ({', '.join(training)}: sections of a training config; load it with "
                "load_config(path, overrides) without cls, as every mage command does)"
            )
        raise ValueError("invalid config:\n" + "\n".join(lines)) from None
    policy_section = getattr(cfg, "policy", None)
    if isinstance(policy_section, PolicyConfig):
        problem = model_spec_problem(policy_section.model)
        if problem is not None:
            line = f"policy.model={policy_section.model!r}: {problem}"
            raise ValueError(f"invalid config:\n  {sources.locate([('policy', 'model')], line)}")
    if isinstance(cfg, RunConfig):
        cfg._sources = sources
    return cfg


# -- training --------------------------------------------------------------------------


class TrainSection(Section):
    """The training loop."""

    iterations: int = Field(10, ge=1, description="Rollout-and-update iterations.")
    out_dir: str = Field("runs", description="Parent folder of run folders.")
    run_name: str | None = Field(
        None, description="Run folder name (default: the config file's stem)."
    )
    save_every: int = Field(1, ge=1, description="Checkpoint every N iterations (and at the end).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk.")
    save_samples: int = Field(
        5, ge=0, description="Calls and credit to samples/ every N iterations and the last. 0: off"
    )
    backend: Literal["local", "ray", "openrlhf"] = Field(
        "local",
        description="local: one process; ray: rollout workers as Ray actors on CPUs, the "
        "learner in this process (docs/cluster.md); openrlhf: OpenRLHF's DeepSpeed + vLLM "
        "Ray PPO on GPUs with MAGE rollouts and advantages (needs the cluster extra).",
    )
    ray_address: str | None = Field(
        None,
        description="Ray cluster to join (e.g. 'auto' or 'ray://head:10001'); None starts a "
        "local Ray instance.",
    )
    num_workers: int = Field(
        2, ge=1, description="Rollout workers of backend ray (one CPU and one engine each)."
    )
    recompute_old_logprobs: Literal["auto", "always", "never"] = Field(
        "auto",
        description="PPO's old log-probs: 'never' uses the sampler's recorded ones (exact "
        "only in fp32); 'always' rescores them with the learner; 'auto' rescores unless "
        "engine and learner both compute in fp32 (bf16 sampling is off by up to ~0.4 nats).",
    )


class TrainConfig(RunConfig):
    """A training experiment: a rollout config plus returns, advantages, learner, loop."""

    returns: ReturnConfig = Field(default_factory=ReturnConfig)
    advantages: AdvantageConfig = Field(default_factory=AdvantageConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    eval: EvalSection = Field(default_factory=EvalSection)
    train: TrainSection = Field(default_factory=TrainSection)
    openrlhf: OpenRLHFSection = Field(default_factory=OpenRLHFSection)
    league: LeagueSection = Field(default_factory=LeagueSection)

    @model_validator(mode="before")
    @classmethod
    def _task_return_defaults(cls, data: Any) -> Any:
        # SPEC §3-4: the penalties and the cross-episode discount belong to the task
        # (c_inv 2.0 for Kuhn, 0.5 for Tic-Tac-Toe and Sokoban; gamma_traj 0.9 for
        # Sokoban): what the config leaves out comes from the environment's registry entry.
        data = with_plugins_loaded(data)
        if not isinstance(data, dict):
            return data
        from mage_rl.envs import ENVS

        env = data.get("env") or {}
        name = env.get("name", "kuhn_poker") if isinstance(env, dict) else "kuhn_poker"
        if not isinstance(name, str) or name not in ENVS:
            return data  # the section check names the problem
        spec = ENVS.get(name)
        returns = data.get("returns")
        returns = dict(returns) if isinstance(returns, dict) else {}
        if not isinstance(data.get("returns", {}), dict):
            return data
        returns.setdefault("invalid_penalty", spec.invalid_penalty)
        returns.setdefault("length_penalty", spec.length_penalty)
        returns.setdefault("gamma_traj", spec.gamma_traj)
        data["returns"] = returns
        return data

    @model_validator(mode="after")
    def _check_training(self) -> TrainConfig:
        if self.learner.temperature != self.policy.temperature:
            raise ValueError(
                f"learner.temperature={self.learner.temperature} differs from "
                f"policy.temperature={self.policy.temperature}; set them equal so the "
                "learner's log-probs match the sampling distribution (PPO ratio 1 on-policy)"
            )
        if self.policy.top_p < 1.0 or self.policy.top_k > 0:
            raise ValueError(
                f"policy.top_p={self.policy.top_p}, policy.top_k={self.policy.top_k}: the "
                "learner cannot reproduce truncated sampling; train with top_p: 1.0 and "
                "top_k: 0 (evaluation sampling is set under eval:)"
            )
        if self.advantages.estimator == "gigpo" and self.rollout.group_size < 2:
            raise ValueError(
                "rollout.group_size=1 leaves GiGPO no group baseline; use group_size >= 2"
            )
        if self.eval.stratify and self.meta.stop_on_success:
            raise ValueError(
                "eval.stratify weighs the last episode of every task, but "
                "meta.stop_on_success: true ends meta-episodes before it; set "
                "meta.stop_on_success: false"
            )
        if self.eval.baselines:
            from mage_rl.graphs import AGENT_GRAPHS

            for name in self.eval.baselines:
                AGENT_GRAPHS.get(name)  # an unknown name lists the registered agents
            if len(set(self.eval.baselines)) != len(self.eval.baselines):
                raise ValueError(f"eval.baselines repeats an agent: {self.eval.baselines}")
            if "untrained" in self.eval.baselines:
                raise ValueError("eval.baselines: 'untrained' is eval.before: true")
        return self
