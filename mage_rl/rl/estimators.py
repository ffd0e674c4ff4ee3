"""Advantage estimators by name: ``gigpo`` and ``grpo`` built in, others registered.

A study or a user who wants another credit assignment registers a function under a name
and selects it with ``advantages.estimator`` in a config, without changing the package::

    from mage_rl.rl.estimators import register_estimator

    def last_episode_only(records, returns, advantages):
        # one advantage per turn of each record, aligned with record.turns
        return [[r.episodes[-1].reward if r.episodes else 0.0] * len(r.turns) for r in records]

    register_estimator("last_episode_only", last_episode_only)

The function gets the batch's :class:`~mage_rl.records.MetaEpisodeRecord` s (every
rollout of every group), the run's :class:`~mage_rl.rl.returns.ReturnConfig` and
:class:`~mage_rl.rl.advantages.AdvantageConfig`, and returns, per record, one advantage
per turn (floats), or :class:`~mage_rl.rl.advantages.CallCredit` s when it has the parts
(return, A_E, A_S) to show in the run's metrics and saved samples. Load the module with
``--plugin`` or a config's ``plugins:`` list, as for agents and environments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mage_rl.sections import BUILTIN_ESTIMATORS, ESTIMATORS


def register_estimator(name: str, fn: Callable[..., Any], *, replace: bool = False) -> None:
    """Register ``fn(records, ret_cfg, adv_cfg)`` as the estimator ``name``.

    Raises:
        ValueError: ``name`` is a built-in estimator, or taken (unless ``replace``).
        TypeError: ``fn`` is not callable.
    """
    if name in BUILTIN_ESTIMATORS:
        raise ValueError(f"{name!r} is a built-in estimator; register yours under another name")
    if not callable(fn):
        raise TypeError(f"register_estimator({name!r}): give a function, got {fn!r}")
    ESTIMATORS.register(name, fn, replace=replace)
