"""The ``advantages:`` section: which estimator credits each call, and how
(:mod:`mage_rl.rl.advantages` computes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mage_rl.registry import PLUGIN_HINT
from mage_rl.sections.estimators import known_estimators

Norm = Literal["mean_norm", "mean_std_norm"]
AnchorScope = Literal["global", "local"]
Grouping = Literal["stationary", "mixed"]

NORMS: tuple[str, ...] = ("mean_norm", "mean_std_norm")
ANCHOR_SCOPES: tuple[str, ...] = ("global", "local")
GROUPINGS: tuple[str, ...] = ("stationary", "mixed")


@dataclass(frozen=True)
class AdvantageConfig:
    """How per-sample advantages are estimated.

    Attributes:
        estimator: ``"gigpo"`` (GiGPO, arXiv 2505.10978: episode-level plus step-level
            anchor-state baselines; what MAGE uses) or ``"grpo"`` (GRPO, arXiv
            2402.03300: one group-normalized outcome per meta-episode, no step credit;
            the plain baseline of SPEC §5), or the name of an estimator registered with
            :func:`~mage_rl.rl.estimators.register_estimator`.
        norm: GiGPO normalization. ``"mean_norm"`` subtracts the group mean only (the
            paper's setting; keeps the reward scale, so large-reward games move the
            policy more). ``"mean_std_norm"`` also divides by ``std + eps``, which makes
            every group's advantages unit scale but inflates near-constant groups.
            GRPO always uses mean and std, as in its paper.
        anchor: ``"global"`` (MAGE default): the anchor key has no episode index, so the
            same state met in different episodes shares one baseline, linking early
            actions to later exploitation. ``"local"`` (ablation): the key includes the
            episode index, so baselines stay within one episode.
        grouping: ``"stationary"`` (MAGE eq. 11-12): a group is one task instance with
            one opponent and anchor keys carry the opponent id, so no baseline mixes
            opponents. ``"mixed"`` (ablation): the group is keyed by ``(env, seed,
            seat)`` and anchor keys drop the opponent, so rollouts against different
            opponents share baselines.
        omega: Weight of the step-level advantage in ``A = A_E + omega * A_S`` (GiGPO
            eq. 8; 1.0 in the paper). 0 reduces GiGPO to its episode-level part.
        eps: Added to the std in ``mean_std_norm`` (and GRPO) to avoid dividing by zero.
    """

    estimator: str = "gigpo"
    norm: Norm = "mean_norm"
    anchor: AnchorScope = "global"
    grouping: Grouping = "stationary"
    omega: float = 1.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.estimator not in known_estimators():
            raise ValueError(
                f"AdvantageConfig.estimator must be one of {known_estimators()}, got "
                f"{self.estimator!r}; to use your own, {PLUGIN_HINT}"
            )
        for name, allowed in (
            ("norm", NORMS),
            ("anchor", ANCHOR_SCOPES),
            ("grouping", GROUPINGS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"AdvantageConfig.{name} must be one of {allowed}, got {value!r}")
        if self.omega < 0:
            raise ValueError(f"AdvantageConfig.omega must be >= 0, got {self.omega}")
        if self.eps <= 0:
            raise ValueError(f"AdvantageConfig.eps must be > 0, got {self.eps}")
