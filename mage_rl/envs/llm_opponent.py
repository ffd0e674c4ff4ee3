"""The ``GAME:llm:RUN_OR_MODEL[@ITER]`` opponent of every two-player OpenSpiel game.

A frozen language model in the other seat, playing as its run's agent plays its first
episode (docs/environments.md). This module is the light half, registered with every
game :func:`~mage_rl.envs.register_env` adds, so a config that names such an opponent
validates anywhere. The model half (its prompts, the exact strategy read from the
model) is :mod:`mage_rl.eval.llm_opponent`, which :mod:`mage_rl.runtime` and the
commands that value opponents (``mage oracle``, ``mage exploitability``) load; it
installs itself as :attr:`LLMOpponent.player`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mage_rl.envs.opponents import Opponent, register_opponent_factory
from mage_rl.rl.run_folder import checkpoint_name

NAME = "llm"
USAGE = "{game}:llm:RUN_OR_MODEL[@ITER]"


def resolve_target(target: str) -> str:
    """``RUN@N`` -> the model folder of iteration ``N``'s checkpoint; else ``target``.

    Raises:
        ValueError: ``@N`` is not a number, or that checkpoint does not exist.
    """
    if "@" not in target:
        return target
    run, _, iteration = target.rpartition("@")
    if not iteration.isdigit():
        raise ValueError(f"{target!r}: write RUN@ITERATION with a whole number, say runs/x@10")
    model = Path(run) / "checkpoints" / checkpoint_name(int(iteration)) / "model"
    if not model.is_dir():
        raise ValueError(f"{target!r}: {model} does not exist (is iteration {iteration} saved?)")
    return str(model)


class LLMOpponent(Opponent):
    """A frozen language model in the other seat.

    Nothing is loaded until the first move, so naming it in a population costs nothing.
    ``player(target, game, seat)`` gives the object whose ``probabilities(state)`` is the
    model's exact distribution over the legal actions at ``state``.
    """

    player: Callable[[str, str, int], Any] | None = None

    def __init__(self, target: str, game: str) -> None:
        self.target = target
        self.game = game
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        """The exact distribution of :meth:`act`: the model's constrained answer."""
        if LLMOpponent.player is None:
            raise RuntimeError(
                f"opponent {self.spec!r} needs its model half: import mage_rl.runtime (or "
                "mage_rl.eval.llm_opponent) before playing it"
            )
        return dict(LLMOpponent.player(self.target, self.game, player).probabilities(state))

    def act(self, state: Any, player: int) -> int:
        probs = self.action_probabilities(state, player)
        actions = sorted(probs)
        weights = np.array([probs[a] for a in actions])
        return int(self._rng.choice(actions, p=weights / weights.sum()))


def register_llm_opponent(game: str) -> None:
    """Make ``GAME:llm:...`` a valid opponent of the two-player OpenSpiel game ``game``."""

    def factory(args: Sequence[str]) -> Opponent:
        if len(args) != 1 or not args[0]:
            raise ValueError(
                f"write the language-model opponent as {USAGE.format(game=game)}, say "
                f"{game}:llm:smollm2 or {game}:llm:runs/my_run@10"
            )
        return LLMOpponent(args[0], game)

    register_opponent_factory(game, NAME, factory, USAGE.format(game=game))
