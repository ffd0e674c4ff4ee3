"""The sections of a training config below the code that reads them: ``learner:``,
``returns:``, ``advantages:`` (with the advantage estimators' names), ``league:``,
``eval:`` and ``openrlhf:``.

:mod:`mage_rl.config` assembles them with its own sections into ``TrainConfig``; the
learner, the return and advantage code, the league, the evaluation during training and
the OpenRLHF backend read their section from here, so a config never imports the code
that runs it.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, model_validator

from mage_rl.defaults import EVAL_SEED, EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P
from mage_rl.policy.model_specs import DType
from mage_rl.registry import PLUGIN_HINT, Registry

# -- the advantage estimators' names -----------------------------------------------


BUILTIN_ESTIMATORS: tuple[str, ...] = ("gigpo", "grpo")

ESTIMATORS: Registry[Callable[..., Any]] = Registry("advantage estimator")


def known_estimators() -> list[str]:
    """Every estimator name a config may give."""
    return [*BUILTIN_ESTIMATORS, *ESTIMATORS.names()]


# -- learner: ----------------------------------------------------------------------


KLKind = Literal["k1", "k2", "k3", "low_var_kl", "kl", "mse"]

LOSS_TERMS: Registry[Callable[..., Any]] = Registry("loss term")
"""Extra loss terms by name (:func:`~mage_rl.rl.loss_terms.register_loss_term`), which
``learner.loss_terms`` may list."""

DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


class Section(BaseModel):
    """A config section: unknown keys refused, scalars read strictly, assignments checked.

    Every section of a config is one of these, with its help in each field's
    ``description``; tuple fields also take a YAML list.
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


def _list_or_tuple(default: tuple[Any, ...], description: str) -> Any:
    """A tuple field that a YAML list fills (strict mode wants a tuple)."""
    return Field(default, strict=False, description=description)


class LearnerConfig(Section):
    """Optimization settings of the embedded learner (``learner:``)."""

    lr: float = Field(
        1e-6,
        gt=0.0,
        description="AdamW learning rate, constant after the warm-up (paper: 1e-6 for "
        "Qwen3-4B full fine-tuning). Small models and LoRA adapters tolerate and need "
        "larger values (1e-5..1e-4).",
    )
    lr_warmup_steps: int = Field(
        0,
        ge=0,
        description="Optimizer steps over which the learning rate rises linearly to lr "
        "(step k, counted from 0, uses lr * (k + 1) / lr_warmup_steps); 0 starts at lr. "
        "Adam's first steps move every weight by about lr whatever the gradient's size, so "
        "a warm-up keeps the first noisy batches from pushing the policy far. The step "
        "count is saved with checkpoints.",
    )
    weight_decay: float = Field(
        0.0,
        ge=0.0,
        description="AdamW decoupled weight decay; 0 keeps the policy close to its "
        "initialization only through the KL term.",
    )
    betas: tuple[StrictFloat, StrictFloat] = _list_or_tuple(
        (0.9, 0.999), "AdamW moment coefficients, two values in [0, 1)."
    )
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    clip_eps: float = Field(
        0.2,
        gt=0.0,
        description="PPO clip range (PPO eq. 7; 0.2). Larger values allow bigger policy "
        "moves per step at the cost of stability.",
    )
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="Weight of the KL loss to the reference (initial) policy; 0 disables it "
        "and no reference copy is kept. SPEC §6 uses 0.1 for the games (the config files "
        "set it); it limits drift and language degradation but slows learning.",
    )
    kl_kind: KLKind = Field(
        "low_var_kl",
        description="KL estimator: low_var_kl (k3, Schulman 2020; unbiased and "
        "non-negative), k1 or k2.",
    )
    entropy_coef: float = Field(
        0.001,
        ge=0.0,
        description="Weight of the entropy bonus (SPEC §6: 0.001); keeps exploration alive, "
        "too large a value makes responses ramble.",
    )
    max_grad_norm: float = Field(
        1.0,
        ge=0.0,
        description="Global gradient-norm clip; 0 disables clipping (the norm is still reported).",
    )
    mini_batch_size: int = Field(
        64,
        ge=1,
        description="LLM calls per optimizer step (paper: 64). A batch of N per-call samples "
        "gives ceil(N / mini_batch_size) steps per epoch; a conversation sample counts one "
        "call per segment and is never split across steps.",
    )
    micro_batch_tokens: int = Field(
        4096,
        ge=1,
        description="Budget of tokens (prompt + response) per forward pass: padded tokens, "
        "or the nodes of a prefix tree with prefix_tree; trades memory for speed, leaves "
        "the gradient unchanged.",
    )
    prefix_tree: bool = Field(
        True,
        description="Feed each forward pass as one prefix tree (mage_rl.rl.prefix_tree): "
        "the samples' shared prefixes (the system prompt, rounds that rollouts of one task "
        "played alike) are computed once, the gradient stays the same. Used where the "
        "model's attention takes a custom mask (Hugging Face SDPA); other models get "
        "right-padded rows.",
    )
    ppo_epochs: int = Field(
        1,
        ge=1,
        description="Passes over the batch (SPEC §6: 1). More epochs reuse samples more but "
        "go further off-policy.",
    )
    shuffle: bool = Field(
        True,
        description="Shuffle samples before cutting mini-batches (seeded by seed), so a "
        "mini-batch mixes groups.",
    )
    seed: int = Field(
        0, description="Seed of the shuffling generator (saved and restored with checkpoints)."
    )
    temperature: float = Field(
        1.0,
        gt=0.0,
        description="Temperature the rollouts were sampled at; logits are divided by it so "
        "that the learner's log-probs match the sampling distribution and the ratio starts "
        "at 1. Top-p/top-k truncation cannot be reproduced, so train with top_p 1 and "
        "top_k 0 (the paper samples at 1.0).",
    )
    dtype: DType = Field(
        "auto",
        description="Forward-pass precision. fp32: exact. bf16: bfloat16 autocast (master "
        "weights and optimizer stay float32). auto: bf16 on CUDA with bf16 support or on "
        "CPUs with avx512_bf16/amx_bf16, else fp32.",
    )
    lora: bool = Field(
        False,
        description="Train LoRA adapters (arXiv 2106.09685) instead of all weights; the "
        "reference policy is then the base model with adapters disabled, so no copy is "
        "needed.",
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(
        32, ge=1, description="LoRA scaling numerator (scale = lora_alpha / lora_r)."
    )
    lora_dropout: float = Field(
        0.0, ge=0.0, description="Dropout inside the adapters (0 keeps the ratio exact on-policy)."
    )
    lora_target_modules: tuple[str, ...] = _list_or_tuple(
        DEFAULT_LORA_TARGETS,
        "Module names that get adapters (all attention and MLP projections of "
        "Llama/Qwen-style models by default).",
    )
    loss_terms: tuple[str, ...] = _list_or_tuple(
        (),
        "Names of extra loss terms registered with mage_rl.rl.loss_terms.register_loss_term, "
        "added to the loss in this order (none by default: the loss is MAGE's).",
    )

    @model_validator(mode="after")
    def _check(self) -> LearnerConfig:
        unknown = [name for name in self.loss_terms if name not in LOSS_TERMS]
        if unknown:
            raise ValueError(
                f"learner.loss_terms names {unknown}, which no code registered "
                f"(registered: {LOSS_TERMS.names()}); to use your own, {PLUGIN_HINT}"
            )
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"learner.betas must be two values in [0, 1), got {self.betas}")
        if self.lora and not self.lora_target_modules:
            raise ValueError("learner.lora_target_modules is empty; name the modules to adapt")
        return self


# -- returns: ----------------------------------------------------------------------


RewardMode = Literal["differential", "cumulative", "single_episode"]
REWARD_MODES: tuple[str, ...] = typing.get_args(RewardMode)


class ReturnConfig(Section):
    """How rewards of a meta-episode become per-sample returns and scores (``returns:``)."""

    mode: RewardMode = Field(
        "differential",
        description="Reward formulation. differential is MAGE (paper eq. 5): each episode is "
        "credited with its improvement D_k = R_k - R_{k-1}, so the D_k add up to the last "
        "episode's reward and the objective is the final episode; early episodes are free "
        "to explore, a win after a loss is worth twice a win. cumulative is LaMer (arXiv "
        "2512.16848): the same two-gamma recursion over the raw R_k; every episode's win "
        "counts, which rewards exploiting from the first episode on. single_episode: raw "
        "R_k and no propagation across episodes (standard multi-turn RL inside a "
        "meta-episode).",
    )
    gamma_step: float = Field(
        0.95,
        ge=0.0,
        le=1.0,
        description="Discount between two play turns of the same episode (paper: 0.95). "
        "Lower values concentrate credit on the turns close to the episode's end.",
    )
    gamma_traj: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="Discount across an episode boundary (paper: 0.6 for the games, 0.9 for "
        "Sokoban): how much a later episode's outcome credits the earlier episodes' moves "
        "(exploration that pays later). Ignored (treated as 0) in the single_episode mode.",
    )
    invalid_penalty: float = Field(
        0.5,
        ge=0.0,
        description="c_inv, subtracted from the episode-level score of a sample whose "
        "response held no parsable legal action (or a reflect turn without a <remark> tag); "
        "the size of the penalty, the code applies the sign. SPEC §3: 0.5 for Tic-Tac-Toe "
        "and Sokoban, 2.0 for Kuhn Poker. Too large a value teaches the agent to play safe, "
        "legal moves only.",
    )
    length_penalty: float = Field(
        2.0,
        ge=0.0,
        description="c_len, weight of the soft over-length penalty w(L) (SPEC §3): 2.0 for "
        "the games, 1.0 for Sokoban. It discourages responses that approach the length "
        "limit and get truncated.",
    )
    reward_to_go: bool = Field(
        False,
        description="differential mode only. D_k = R_k - R_{k-1} charges the turns of "
        "episode k with the previous episode's reward, which nothing they do can change. "
        "With this on they are not charged it: their returns and scores drop the -R_{k-1} "
        "term (the score becomes R_k), while the turns of episode k-1, whose result it is, "
        "keep it through gamma_traj. What is dropped is fixed by the history the turn has "
        "already seen, so the expected policy gradient is MAGE's and the objective is "
        "still the last episode, with lower variance (the reward-to-go form of the policy "
        "gradient). Off by default (SPEC §4 as written).",
    )

    @model_validator(mode="after")
    def _check(self) -> ReturnConfig:
        if self.reward_to_go and self.mode != "differential":
            raise ValueError(
                f"returns.reward_to_go applies to mode 'differential' only (mode "
                f"{self.mode!r} has no past-episode term to drop); set it to false"
            )
        return self

    @property
    def effective_gamma_traj(self) -> float:
        """``gamma_traj`` as used by the recursion: 0 in the ``single_episode`` mode."""
        return 0.0 if self.mode == "single_episode" else self.gamma_traj


# -- advantages: -------------------------------------------------------------------


Norm = Literal["mean_norm", "mean_std_norm"]
AnchorScope = Literal["global", "local"]
Grouping = Literal["stationary", "mixed"]

NORMS: tuple[str, ...] = typing.get_args(Norm)
ANCHOR_SCOPES: tuple[str, ...] = typing.get_args(AnchorScope)
GROUPINGS: tuple[str, ...] = typing.get_args(Grouping)


class AdvantageConfig(Section):
    """How per-sample advantages are estimated (``advantages:``)."""

    estimator: str = Field(
        "gigpo",
        description="gigpo (GiGPO, arXiv 2505.10978: episode-level plus step-level "
        "anchor-state baselines; what MAGE uses), grpo (GRPO, arXiv 2402.03300: one "
        "group-normalized outcome per meta-episode, no step credit; the plain baseline of "
        "SPEC §5), or the name of an estimator registered with "
        "mage_rl.rl.estimators.register_estimator.",
    )
    norm: Norm = Field(
        "mean_norm",
        description="GiGPO normalization. mean_norm subtracts the group mean only (the "
        "paper's; keeps the reward scale, so large-reward games move the policy more). "
        "mean_std_norm also divides by std + eps, which makes every group's advantages unit "
        "scale but inflates near-constant groups. GRPO always uses mean and std.",
    )
    anchor: AnchorScope = Field(
        "global",
        description="global (MAGE): the anchor key has no episode index, so the same state "
        "met in different episodes shares one baseline, linking early actions to later "
        "exploitation. local (ablation): the key includes the episode index, so baselines "
        "stay within one episode.",
    )
    grouping: Grouping = Field(
        "stationary",
        description="stationary (MAGE eq. 11-12): a group is one task instance with one "
        "opponent and anchor keys carry the opponent id, so no baseline mixes opponents. "
        "mixed (ablation): the group is keyed by (env, seed, seat) and anchor keys drop the "
        "opponent, so rollouts against different opponents share baselines.",
    )
    omega: float = Field(
        1.0,
        ge=0.0,
        description="Weight of the step-level advantage in A = A_E + omega * A_S (GiGPO eq. "
        "8; 1.0 in the paper). 0 reduces GiGPO to its episode-level part.",
    )
    eps: float = Field(
        1e-6,
        gt=0.0,
        description="Added to the std in mean_std_norm (and GRPO) to avoid dividing by zero.",
    )

    @model_validator(mode="after")
    def _check(self) -> AdvantageConfig:
        if self.estimator not in known_estimators():
            raise ValueError(
                f"advantages.estimator must be one of {known_estimators()}, got "
                f"{self.estimator!r}; to use your own, {PLUGIN_HINT}"
            )
        return self


# -- league: -----------------------------------------------------------------------


class LeagueSection(Section):
    """Snapshots of the policy as opponents (``league:``; off while ``every`` is 0)."""

    every: int = Field(0, ge=0, description="Iterations between snapshots; 0: no league.")
    size: int = Field(4, ge=1, le=16, description="Most members; the oldest leaves first.")
    share: float = Field(
        0.5, gt=0.0, lt=1.0, description="Share of each batch's opponents drawn from the league."
    )
    weighting: Literal["uniform", "prioritized"] = Field(
        "uniform", description="uniform, or prioritized by (1 - win rate)^2 (rl/league.py)."
    )


# -- eval: -------------------------------------------------------------------------


class EvalSection(Section):
    """Periodic evaluation during training, on a fixed set of task seeds."""

    every: int = Field(
        0, ge=0, description="Evaluate every N iterations (0: only after the last one)."
    )
    tasks: int = Field(16, ge=0, description="Task instances per evaluation (0 disables it).")
    seed: int = Field(
        EVAL_SEED, description="Base seed of the evaluation tasks (kept apart from training seeds)."
    )
    temperature: float = Field(
        EVAL_TEMPERATURE, ge=0.0, description="Evaluation sampling (SPEC §6: 0.7)."
    )
    top_p: float = Field(EVAL_TOP_P, gt=0.0, le=1.0, description="Evaluation top-p (SPEC §6: 0.8).")
    top_k: int = Field(EVAL_TOP_K, ge=0, description="Evaluation top-k (SPEC §6: 20).")
    before: bool = Field(
        False,
        description="Also evaluate the untrained policy before iteration 1 (label "
        "`untrained`), on the same tasks.",
    )
    baselines: list[str] = Field(
        default_factory=list,
        description="Agents (react, reflexion or a registered one) evaluated on the base "
        "model before iteration 1, on the same tasks and settings.",
    )
    baseline_tasks: int = Field(
        0,
        ge=0,
        description="Task instances for the agents of `baselines` (0, or `tasks` and more: "
        "all of them). Fewer plays the first ones of the same tasks (stratified: the first "
        "seeds of every stratum, at least 2), for a cheaper comparison with wider intervals.",
    )
    stratify: bool = Field(
        False,
        description="Stratified tasks: every opponent, seat and deal of the last "
        "episode alike (two-player card games; narrows the ev@k intervals).",
    )
    cache: bool = Field(
        True,
        description="Reuse the evaluations before iteration 1 (untrained, baselines) that "
        "an earlier run on this machine computed with the same weights, tokenizer, "
        "evaluation settings, tasks and code ($MAGE_RL_CACHE/eval, docs/training.md): "
        "seconds instead of minutes. false: always play them, and store nothing.",
    )


# -- openrlhf: ---------------------------------------------------------------------


class OpenRLHFSection(Section):
    """Placement of the actor, reference and vLLM engines (``train.backend: openrlhf``)."""

    actor_nodes: int = Field(1, ge=1, description="Nodes of the DeepSpeed actor group.")
    actor_gpus_per_node: int = Field(
        8, ge=1, description="GPUs per node of the actor group (one DeepSpeed rank each)."
    )
    ref_nodes: int = Field(1, ge=1, description="Nodes of the reference group (KL to the start).")
    ref_gpus_per_node: int = Field(8, ge=1, description="GPUs per node of the reference group.")
    vllm_engines: int = Field(
        8, ge=1, description="vLLM engines that sample the rollouts (each a Ray actor)."
    )
    vllm_tensor_parallel: int = Field(
        1, ge=1, description="GPUs per vLLM engine; 1 fits a 4B model in bf16 on one GPU."
    )
    vllm_gpu_memory_utilization: float = Field(
        0.6,
        gt=0.0,
        le=1.0,
        description="Share of a GPU vLLM may take (weights + KV cache); lower it when "
        "colocated with DeepSpeed.",
    )
    colocate_all: bool = Field(
        True,
        description="Put actor, reference and vLLM on the same GPUs, each sleeping while "
        "the others run (OpenRLHF's hybrid engine). Needs actor GPUs == vLLM engines x "
        "tensor parallel; halves the GPUs needed at the cost of wake/sleep time.",
    )
    zero_stage: int = Field(
        3, ge=0, le=3, description="DeepSpeed ZeRO stage of actor and reference (3 shards all)."
    )
    adam_offload: bool = Field(False, description="Keep Adam states in CPU memory (slower).")
    gradient_checkpointing: bool = Field(
        True, description="Recompute activations in the backward pass (less memory, ~30% slower)."
    )
    micro_train_batch_size: int = Field(
        4, ge=1, description="Samples per GPU per forward/backward of the PPO update."
    )
    micro_rollout_batch_size: int = Field(
        8, ge=1, description="Samples per GPU per forward when scoring log-probs."
    )
    max_len: int = Field(
        8192,
        ge=64,
        description="Longest prompt + response in tokens (vLLM max_model_len); the "
        "reflection prompts of late episodes are the longest.",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="Further OpenRLHF flags passed through verbatim, e.g. "
        "['--vllm.enable_prefix_caching'].",
    )

    @model_validator(mode="after")
    def _check(self) -> OpenRLHFSection:
        actor_gpus = self.actor_nodes * self.actor_gpus_per_node
        vllm_gpus = self.vllm_engines * self.vllm_tensor_parallel
        if self.colocate_all and actor_gpus != vllm_gpus:
            raise ValueError(
                f"openrlhf.colocate_all needs as many actor GPUs ({self.actor_nodes} x "
                f"{self.actor_gpus_per_node} = {actor_gpus}) as vLLM GPUs "
                f"({self.vllm_engines} x {self.vllm_tensor_parallel} = {vllm_gpus}); "
                "change vllm_engines or set colocate_all: false"
            )
        return self
