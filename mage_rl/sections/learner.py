"""Settings of the embedded learner (:class:`~mage_rl.rl.learner.Learner`): optimizer,
PPO loss, KL and entropy terms, batching, precision and LoRA.

Kept apart from the learner so that configs can name them without importing the learner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from mage_rl.policy.models import DType
from mage_rl.registry import PLUGIN_HINT, Registry

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


@dataclass(frozen=True)
class LearnerConfig:
    """Optimization settings of the embedded learner.

    Attributes:
        lr: AdamW learning rate, constant after the warm-up (paper: 1e-6 for Qwen3-4B
            full fine-tuning). Small models and LoRA adapters tolerate and need larger
            values (1e-5..1e-4).
        lr_warmup_steps: Optimizer steps over which the learning rate rises linearly to
            ``lr`` (step ``k``, counted from 0, uses ``lr * (k + 1) / lr_warmup_steps``);
            0 starts at ``lr``. Adam's first steps move every weight by about ``lr``
            whatever the gradient's size, so a warm-up keeps the first noisy batches
            from pushing the policy far. The step count is saved with checkpoints.
        weight_decay: AdamW decoupled weight decay; 0 keeps the policy close to its
            initialization only through the KL term.
        betas: AdamW moment coefficients.
        adam_eps: AdamW epsilon.
        clip_eps: PPO clip range (PPO eq. 7; 0.2). Larger values allow bigger policy
            moves per step at the cost of stability.
        kl_coef: Weight of the KL loss to the reference (initial) policy; 0 disables it
            and no reference copy is kept. SPEC §6 uses 0.1 for the games (the config
            files set it); it limits drift and language degradation but slows learning.
        kl_kind: KL estimator: ``"low_var_kl"`` (k3, Schulman 2020; unbiased and
            non-negative), ``"k1"`` or ``"k2"``.
        entropy_coef: Weight of the entropy bonus (SPEC §6: 0.001); keeps exploration
            alive, too large a value makes responses ramble.
        max_grad_norm: Global gradient-norm clip; ``0`` disables clipping (the norm is
            still reported).
        mini_batch_size: LLM calls per optimizer step (paper: 64). A batch of N per-call
            samples gives ``ceil(N / mini_batch_size)`` steps per epoch; a conversation
            sample counts one call per segment and is never split across steps.
        micro_batch_tokens: Budget of tokens (prompt + response) per forward pass:
            padded tokens, or the nodes of a prefix tree with ``prefix_tree``; trades
            memory for speed, leaves the gradient unchanged.
        prefix_tree: Feed each forward pass as one prefix tree (:mod:`mage_rl.rl.prefix_tree`):
            the samples' shared prefixes (the system prompt, rounds that rollouts of one
            task played alike) are computed once, the gradient stays the same. Used
            where the model's attention takes a custom mask (Hugging Face SDPA); other
            models get right-padded rows.
        ppo_epochs: Passes over the batch (SPEC §6: 1). More epochs reuse samples more
            but go further off-policy.
        shuffle: Shuffle samples before cutting mini-batches (seeded by ``seed``), so a
            mini-batch mixes groups.
        seed: Seed of the shuffling generator (saved and restored with checkpoints).
        temperature: Temperature the rollouts were sampled at; logits are divided by it
            so that the learner's log-probs match the sampling distribution and the
            ratio starts at 1. Top-p/top-k truncation cannot be reproduced, so train
            with ``top_p = 1`` and ``top_k = 0`` (the paper samples at 1.0).
        dtype: Forward-pass precision. ``"fp32"``: exact. ``"bf16"``: bfloat16 autocast
            (master weights and optimizer stay float32). ``"auto"``: bf16 on CUDA with bf16
            support or on CPUs with ``avx512_bf16``/``amx_bf16``, else fp32.
        lora: Train LoRA adapters (arXiv 2106.09685) instead of all weights; the
            reference policy is then the base model with adapters disabled, so no copy
            is needed.
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator (scale = ``lora_alpha / lora_r``).
        lora_dropout: Dropout inside the adapters (0 keeps the ratio exact on-policy).
        lora_target_modules: Module names that get adapters (all attention and MLP
            projections of Llama/Qwen-style models by default).
        loss_terms: Names of extra loss terms registered with
            :func:`~mage_rl.rl.loss_terms.register_loss_term`, added to the loss in this
            order (none by default: the loss is MAGE's).
    """

    lr: float = 1e-6
    lr_warmup_steps: int = 0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    kl_kind: KLKind = "low_var_kl"
    entropy_coef: float = 0.001
    max_grad_norm: float = 1.0
    mini_batch_size: int = 64
    micro_batch_tokens: int = 4096
    prefix_tree: bool = True
    ppo_epochs: int = 1
    shuffle: bool = True
    seed: int = 0
    temperature: float = 1.0
    dtype: DType = "auto"
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] = DEFAULT_LORA_TARGETS
    loss_terms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        positive = ("lr", "adam_eps", "clip_eps", "temperature")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"LearnerConfig.{name} must be > 0, got {getattr(self, name)}")
        non_negative = (
            "weight_decay",
            "kl_coef",
            "entropy_coef",
            "max_grad_norm",
            "lora_dropout",
            "lr_warmup_steps",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"LearnerConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("mini_batch_size", "micro_batch_tokens", "ppo_epochs", "lora_r", "lora_alpha"):
            if getattr(self, name) < 1:
                raise ValueError(f"LearnerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(
                f"LearnerConfig.dtype must be 'auto', 'bf16' or 'fp32', got {self.dtype!r}"
            )
        unknown = [name for name in self.loss_terms if name not in LOSS_TERMS]
        if unknown:
            raise ValueError(
                f"LearnerConfig.loss_terms names {unknown}, which no code registered "
                f"(registered: {LOSS_TERMS.names()}); to use your own, {PLUGIN_HINT}"
            )
        if self.kl_kind not in ("k1", "k2", "k3", "low_var_kl", "kl", "mse"):
            raise ValueError(f"LearnerConfig.kl_kind {self.kl_kind!r} is unknown; use 'low_var_kl'")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"LearnerConfig.betas must be two values in [0, 1), got {self.betas}")
        if self.lora and not self.lora_target_modules:
            raise ValueError(
                "LearnerConfig.lora_target_modules is empty; name the modules to adapt"
            )
