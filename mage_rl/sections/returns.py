"""The ``returns:`` section: how a meta-episode's rewards become returns and scores
(:mod:`mage_rl.rl.returns` computes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RewardMode = Literal["differential", "cumulative", "single_episode"]
REWARD_MODES: tuple[str, ...] = ("differential", "cumulative", "single_episode")


@dataclass(frozen=True)
class ReturnConfig:
    """How rewards of a meta-episode become per-sample returns and scores.

    Attributes:
        mode: Reward formulation. ``"differential"`` is MAGE (paper eq. 5): each episode
            is credited with its improvement ``D_k = R_k - R_{k-1}``, so the ``D_k`` add up
            to the last episode's reward and the objective is the final episode. Early
            episodes are free to explore; a win after a loss is worth twice a win.
            ``"cumulative"`` is LaMer (arXiv 2512.16848): the same two-gamma recursion
            over the raw ``R_k``; every episode's win counts, which rewards exploiting
            from the first episode on. ``"single_episode"``: raw ``R_k`` and no
            propagation across episodes (standard multi-turn RL inside a meta-episode).
        gamma_step: Discount between two play turns of the same episode (paper: 0.95).
            Lower values concentrate credit on the turns close to the episode's end.
        gamma_traj: Discount across an episode boundary (paper: 0.6 for the games, 0.9
            for Sokoban). It decides how much a later episode's outcome credits the
            earlier episodes' moves (exploration that pays later). Ignored (treated as 0)
            in the ``single_episode`` mode.
        invalid_penalty: ``c_inv``, subtracted from the episode-level score of a sample
            whose response held no parsable legal action (or a reflect turn without a
            ``<remark>`` tag). SPEC §3: 0.5 for Tic-Tac-Toe and Sokoban, 2.0 for Kuhn
            Poker. Too large a value teaches the agent to play safe, legal moves only.
        length_penalty: ``c_len``, weight of the soft over-length penalty ``w(L)`` (SPEC
            §3): 2.0 for the games, 1.0 for Sokoban. It discourages responses that
            approach the length limit and get truncated.
        reward_to_go: ``"differential"`` mode only. ``D_k = R_k - R_{k-1}`` charges the
            turns of episode k with the previous episode's reward, which nothing they do
            can change. With this on, they are not charged it: their returns and scores
            drop the ``-R_{k-1}`` term (the score becomes ``R_k``), while the turns of
            episode k-1, whose result it is, keep it through ``gamma_traj``. What is
            dropped from a turn's target is fixed by the history the turn has already
            seen, so the expected policy gradient is MAGE's and the objective is still
            the last episode; the variance is lower (the reward-to-go form of the policy
            gradient). Off by default (SPEC §4 as written).
    """

    mode: RewardMode = "differential"
    gamma_step: float = 0.95
    gamma_traj: float = 0.6
    invalid_penalty: float = 0.5
    length_penalty: float = 2.0
    reward_to_go: bool = False

    def __post_init__(self) -> None:
        if self.mode not in REWARD_MODES:
            raise ValueError(f"ReturnConfig.mode must be one of {REWARD_MODES}, got {self.mode!r}")
        for name in ("gamma_step", "gamma_traj"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ReturnConfig.{name} must be in [0, 1], got {value}")
        if self.reward_to_go and self.mode != "differential":
            raise ValueError(
                f"ReturnConfig.reward_to_go applies to mode 'differential' only (mode "
                f"{self.mode!r} has no past-episode term to drop); set it to false"
            )
        for name in ("invalid_penalty", "length_penalty"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(
                    f"ReturnConfig.{name} is the size of a penalty and must be >= 0, got {value}"
                    " (the sign is applied by the code)"
                )

    @property
    def effective_gamma_traj(self) -> float:
        """``gamma_traj`` as used by the recursion: 0 in the ``single_episode`` mode."""
        return 0.0 if self.mode == "single_episode" else self.gamma_traj
