"""The language-model opponents of every two-player OpenSpiel game: ``GAME:llm:RUN_OR_MODEL[@ITER]``
and ``GAME:self``.

``GAME:llm:...`` is a frozen language model in the other seat, playing as its run's agent
plays its first episode; ``GAME:self`` is the policy being trained, playing the same way
(self-play; docs/environments.md). This module is the light half, registered with every
game :func:`~mage_rl.envs.register_env` adds, so a config that names such an opponent
validates anywhere. The model half (its prompts, the exact strategy read from the
model, its calls) is :mod:`mage_rl.players.seat_player`: :mod:`mage_rl.runtime` and the
commands that value opponents (``mage oracle``, ``mage exploitability``) install it as
:attr:`LLMOpponent.player`; the trainer installs :attr:`SelfOpponent.player`, the current
policy.

Both keep their calls (:attr:`LLMOpponent.calls`, kind ``"opponent"``), which the
rollout puts in the record's ``opponent_calls``; those of ``self`` are trained
(:mod:`mage_rl.rl.selfplay`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mage_rl.envs.opponents import Opponent, Population, register_opponent_factory
from mage_rl.records import Turn
from mage_rl.train_folder import checkpoint_name

NAME = "llm"
USAGE = "{game}:llm:RUN_OR_MODEL[@ITER]"
SELF = "self"


def is_self(spec: str) -> bool:
    """Whether the canonical opponent spec ``spec`` is ``GAME:self``."""
    return spec.split(":")[1:] == [SELF]


def without_self(population: Population) -> Population | None:
    """``population`` without ``GAME:self``, the weights of the rest renormalised on use;
    ``None`` when nothing else is in it. What evaluations play: the policy itself has no
    fixed value to compare with."""
    kept = tuple(
        (spec, float(weight))
        for spec, weight in zip(population.specs, population.weights, strict=True)
        if not is_self(spec)
    )
    if len(kept) == len(population.specs):
        return population
    return Population(kept) if kept else None


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
    ``player(target, game, seat)`` gives the object (a
    :class:`~mage_rl.players.seat_player.SeatPlayer`) whose ``probabilities(state)`` is the
    model's exact distribution over the legal actions at ``state`` and whose
    ``play(state, rng)`` draws one and returns it with its call.
    """

    player: Callable[[str, str, int], Any] | None = None
    trained = False
    """Whether the learner trains on this opponent's calls."""

    def __init__(self, target: str, game: str) -> None:
        self.target = target
        self.game = game
        self._rng = np.random.default_rng(0)
        self.calls: list[Turn] = []
        self._episode = -1
        self._step = 0

    def seat_player(self, player: int) -> Any:
        """The model half playing ``player``'s seat."""
        if LLMOpponent.player is None:
            raise RuntimeError(
                f"opponent {self.spec!r} needs its model half: import mage_rl.runtime (or "
                "mage_rl.players.seat_player) before playing it"
            )
        return LLMOpponent.player(self.target, self.game, player)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._episode += 1
        self._step = 0

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        """The exact distribution of :meth:`act`: the model's constrained answer."""
        return dict(self.seat_player(player).probabilities(state))

    def act(self, state: Any, player: int) -> int:
        action, call = self.seat_player(player).play(state, self._rng)
        call.episode, call.step = max(self._episode, 0), self._step
        call.opponent, call.trained = self.spec, self.trained
        self.calls.append(call)
        self._step += 1
        return int(action)

    def hand_over(self, reward: float) -> None:
        """The hand's reward for this seat goes on its last call of the hand."""
        hand = [c for c in self.calls if c.episode == max(self._episode, 0)]
        if hand:
            hand[-1].reward = float(reward)


class SelfOpponent(LLMOpponent):
    """The policy being trained, in the other seat (self-play, ``GAME:self``).

    It plays as :class:`LLMOpponent` does (each hand as the agent's first episode, from
    the exact constrained distribution), with the current weights and the run's
    exploration share, and its calls are trained (:mod:`mage_rl.rl.selfplay`). Only a
    trainer can supply the current policy: it installs ``SelfOpponent.player(game,
    seat)``.
    """

    player: Callable[[str, int], Any] | None = None  # type: ignore[assignment]
    trained = True

    def __init__(self, game: str) -> None:
        super().__init__(SELF, game)

    def seat_player(self, player: int) -> Any:
        if SelfOpponent.player is None:
            raise RuntimeError(
                f"opponent {self.spec!r} is the policy being trained: it plays inside "
                f"mage train only. To play a trained model, name {self.game}:llm:RUN"
            )
        return SelfOpponent.player(self.game, player)

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        raise ValueError(
            f"{self.spec!r} is the policy being trained, not a fixed strategy to value; "
            f"value a snapshot instead ({self.game}:llm:RUN@ITER)"
        )


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

    def self_factory(args: Sequence[str]) -> Opponent:
        if args:
            raise ValueError(f"{game}:self takes no arguments, got {':'.join(args)!r}")
        return SelfOpponent(game)

    register_opponent_factory(game, SELF, self_factory, f"{game}:self")
