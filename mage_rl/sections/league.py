"""The ``league:`` section: snapshots of the policy as opponents (:mod:`mage_rl.rl.league`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LeagueSection(BaseModel):
    """Snapshots of the policy as opponents (``league:``; off while ``every`` is 0)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)

    every: int = Field(0, ge=0, description="Iterations between snapshots; 0: no league.")
    size: int = Field(4, ge=1, le=16, description="Most members; the oldest leaves first.")
    share: float = Field(
        0.5, gt=0.0, lt=1.0, description="Share of each batch's opponents drawn from the league."
    )
    weighting: Literal["uniform", "prioritized"] = Field(
        "uniform", description="uniform, or prioritized by (1 - win rate)^2 (rl/league.py)."
    )
