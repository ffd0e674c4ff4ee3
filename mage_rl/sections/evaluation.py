"""The ``eval:`` section of a training config: evaluation during training.

What each setting does is in :mod:`mage_rl.eval.training`; the sampling and seed
defaults are those of ``mage eval`` (:mod:`mage_rl.eval.settings`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from mage_rl.sections.sampling import EVAL_SEED, EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P


class EvalSection(BaseModel):
    """Periodic evaluation during training, on a fixed set of task seeds."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

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
