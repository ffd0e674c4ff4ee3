"""How a Java text world registers its task variants and builds an environment from one.

ScienceWorld and TextWorld-Express differ here only in names: the tasks (or games), the
variant option (``easy``, ``small``), which tasks make the ``train`` and ``unseen``
presets, and the words of their messages. Each module calls these two functions with
its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TypeVar

from mage_rl.envs.opponents import (
    Opponent,
    make_opponent,
    register_opponent_factory,
    register_population,
)
from mage_rl.envs.textworlds import SimulatorEnv, TaskVariant, parse_variant

EnvT = TypeVar("EnvT", bound=SimulatorEnv)

PRESET_SPLITS = (("train", "train"), ("unseen", "test"))
"""Preset suffix and the split of variations it draws from: unseen means the test split."""


def register_variants(
    env: str,
    tasks: Sequence[str],
    option: str,
    *,
    preset_prefix: str,
    preset_tasks: Sequence[str],
    preset_option: str = "",
) -> None:
    """Register ``ENV:TASK:SPLIT[:OPTION]`` for every task, and the two presets.

    Args:
        env: The environment's registered name.
        tasks: Every task (or game) the simulator offers.
        option: The variant option a spec may end with (``easy``, ``small``).
        preset_prefix: The presets are ``{preset_prefix}_train`` and ``_unseen``.
        preset_tasks: The tasks the presets weigh equally.
        preset_option: The option every preset spec carries, or ``""``.
    """
    for task in tasks:
        usage = f"{env}:{task}:{{train|dev|test}}[:{option}]"
        build = partial(parse_variant, env, task, options=(option,), usage=usage)
        register_opponent_factory(env, task, build, usage)
    suffix = f":{preset_option}" if preset_option else ""
    for preset, split in PRESET_SPLITS:
        register_population(
            f"{preset_prefix}_{preset}",
            ",".join(f"{env}:{t}:{split}{suffix}=1" for t in preset_tasks),
        )


def make_variant_env(
    cls: type[EnvT],
    variant: str | Opponent,
    seat: int,
    max_turns: int | None,
    *,
    env: str,
    title: str,
    task_word: str,
) -> EnvT:
    """Build ``cls`` for a variant spec (or variant) of the environment ``env``.

    Args:
        cls: The environment class.
        variant: A spec such as ``scienceworld:find-plant:train``, or the variant itself.
        seat: Must be 0: these are single-agent tasks.
        max_turns: Turns per episode, or ``None`` for the class's default.
        env: The environment's registered name, which the variant must carry.
        title: The simulator's name in messages (``ScienceWorld``).
        task_word: What the spec's second part names in messages (``TASK``, ``GAME``).

    Raises:
        ValueError: A spec of another environment, an unknown task or split, or a seat
            other than 0.
    """
    if seat != 0:
        raise ValueError(f"{title} is a single-agent task; its only seat is 0 (first), got {seat}")
    if isinstance(variant, str):
        variant = make_opponent(variant)
    if not isinstance(variant, TaskVariant) or variant.env != env:
        raise ValueError(f"{variant!r} is not a {title} variant; write {env}:{task_word}:SPLIT")
    return cls(variant, max_turns=max_turns)
