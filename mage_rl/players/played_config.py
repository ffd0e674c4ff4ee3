"""Which config a model or training run plays with, when it is measured or is an opponent.

``mage exploitability TARGET`` and the ``GAME:llm:TARGET`` opponents
(:mod:`mage_rl.players.seat_player`) take a training run, one of its checkpoints or a bare
model, and need the prompts, layout, decoding and temperature it plays with.
"""

from __future__ import annotations

from typing import Any

from mage_rl.config import RunConfig, load_config
from mage_rl.config_yaml import parse_overrides, set_path
from mage_rl.envs import canonical_game
from mage_rl.envs.names import GAME_SHORT
from mage_rl.players.play_settings import trained_config
from mage_rl.train_folder import find_run


def _default_population(game: str) -> str:
    return f"{GAME_SHORT.get(game, game)}_train"


def played_config(
    target: str, game: str | None, config: str | None, overrides: list[str]
) -> RunConfig:
    """The run config of the agent that ``target`` names, as ``mage exploitability``
    measures it and a ``GAME:llm:TARGET`` opponent plays it.

    A training run (its folder or a checkpoint) plays its own ``config.yaml`` with the
    checkpoint's weights (:func:`~mage_rl.players.play_settings.trained_config`). Any other model
    (``tiny``, ``smollm2``, a folder) plays ``config``'s settings, or without one the
    defaults of ``mage eval`` with constrained decoding on. ``game`` replaces the
    config's game (then the population is the game's training preset); ``overrides``
    (``key=value``) come last.

    Raises:
        ValueError: ``config`` given with a training run, or a setting breaks a rule.
    """
    if find_run(target) is not None:
        if config:
            raise ValueError(
                f"{target} is a training run and plays its own config.yaml; change its "
                "settings with --set KEY=VALUE instead of --config"
            )
        cfg: Any = trained_config(target, overrides)[1]
    elif config:
        cfg = load_config(config, [*overrides, f"policy.model={target}"])
    else:
        data: dict[str, Any] = {"policy": {"model": target, "constrain_actions": True}}
        name = canonical_game(game or "kuhn_poker")
        data["env"] = {"name": name, "population": _default_population(name)}
        for key, value in parse_overrides(overrides):
            set_path(data, key, value)
        cfg = RunConfig.model_validate(data)
    if game and canonical_game(game) != cfg.env.name:
        data = cfg.model_dump(mode="json")
        name = canonical_game(game)
        data["env"] |= {"name": name, "population": _default_population(name)}
        cfg = type(cfg).model_validate(data)
    return cfg
