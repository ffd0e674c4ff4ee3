"""Defaults the spec fixes and several layers share: the evaluation's sampling and seed
(SPEC §6), used by ``mage eval``, the evaluation during training and the served agent.
Standard library only, so that the command line's help stays fast."""

from __future__ import annotations

EVAL_SEED = 2026
"""Base seed of evaluation task instances (kept apart from training seeds)."""

# The paper's evaluation sampling (SPEC §6).
EVAL_TEMPERATURE = 0.7
EVAL_TOP_P = 0.8
EVAL_TOP_K = 20
