"""The advantage estimators' names: two built in, the others registered by plugins
(:func:`~mage_rl.rl.estimators.register_estimator`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mage_rl.registry import Registry

BUILTIN_ESTIMATORS: tuple[str, ...] = ("gigpo", "grpo")

ESTIMATORS: Registry[Callable[..., Any]] = Registry("advantage estimator")


def known_estimators() -> list[str]:
    """Every estimator name a config may give."""
    return [*BUILTIN_ESTIMATORS, *ESTIMATORS.names()]
