"""Language-model opponents: ``GAME:llm:RUN_OR_MODEL[@ITER]``, wherever a scripted one goes.

A frozen model plays the other seat of a two-player OpenSpiel game as it plays its own
first episode: the prompt its run's agent sees there (built-in ``play`` node, the run's
prompt template and layout; a bare model gets ``mage eval``'s defaults), constrained
decoding over the legal answers, the run's sampling temperature. Under constrained
decoding that agent plays an exact distribution at each information state, which
:class:`~mage_rl.eval.exploitability.ModelReader` reads in one scoring pass (the engine's
own restricted softmax); the opponent draws its move from it with its own seeded
generator. So a move costs no generation, a frozen opponent's table is read once per
information state and shared by every game of the process, and the oracles
(``mage oracle``, ``mage exploitability``, the training report) get its exact
``action_probabilities``.

What it is not (yet): an opponent that remembers earlier episodes of the meta-episode
(every hand is its first), one whose calls appear in the records as LLM calls (its moves
do, as the game's events), or the current policy (self-play).

``RUN_OR_MODEL`` is a training run (its newest checkpoint, or ``RUN@N`` for iteration
``N``), a checkpoint folder, or any model ``load_model`` knows (``tiny``, ``smollm2``, an
HF folder). The spec may hold no ``:``, ``,`` or ``=`` (population syntax).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mage_rl.envs import make_env
from mage_rl.envs.openspiel_env import OpenSpielEnv
from mage_rl.envs.opponents import Opponent, register_opponent_factory
from mage_rl.envs.registry import ENVS
from mage_rl.eval.exploitability import ModelReader, _decision, _Placeholder
from mage_rl.eval.played_config import played_config
from mage_rl.nodes.state import MetaEpisodeContext, graph_options
from mage_rl.policy.models import load_model
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


class _Player:
    """One frozen model at one seat of one game: its prompts and its exact strategy."""

    def __init__(self, target: str, game: str, seat: int) -> None:
        cfg = played_config(resolve_target(target), game, None, [])
        options = dataclasses.replace(graph_options(cfg), constrain_actions=True)
        env = make_env(game, _Placeholder(), seat=seat, max_turns=cfg.env.max_turns)
        assert isinstance(env, OpenSpielEnv)
        env.reset(0)
        self.env = env
        self.ctx = MetaEpisodeContext(env=env, llm=None, options=options)  # type: ignore[arg-type]
        model, tokenizer = _load(cfg.policy.model, cfg.policy.dtype)
        self.reader = ModelReader(model, tokenizer, cfg.policy.temperature)
        self.table: dict[str, dict[int, float]] = {}

    def probabilities(self, state: Any) -> dict[int, float]:
        key = state.information_state_string(self.env.seat)
        if key not in self.table:
            decision = _decision(self.env, self.ctx, state)
            probs = self.reader([decision])[0]
            total = float(sum(probs))
            self.table[key] = {a: p / total for a, p in zip(decision.actions, probs, strict=True)}
        return self.table[key]


@lru_cache(maxsize=4)
def _load(model: str, dtype: str) -> tuple[Any, Any]:
    """One copy of each opponent model per process, shared by its seats."""
    return load_model(model, dtype=dtype)


@lru_cache(maxsize=16)
def _player(target: str, game: str, seat: int) -> _Player:
    return _Player(target, game, seat)


class LLMOpponent(Opponent):
    """A frozen language model in the other seat (see the module notes).

    Nothing is loaded until the first move, so naming it in a population costs nothing.
    """

    def __init__(self, target: str, game: str) -> None:
        self.target = target
        self.game = game
        self._rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def action_probabilities(self, state: Any, player: int) -> dict[int, float]:
        """The exact distribution of :meth:`act`: the model's constrained answer."""
        return dict(_player(self.target, self.game, player).probabilities(state))

    def act(self, state: Any, player: int) -> int:
        probs = self.action_probabilities(state, player)
        actions = sorted(probs)
        weights = np.array([probs[a] for a in actions])
        return int(self._rng.choice(actions, p=weights / weights.sum()))


def register_llm_opponents() -> None:
    """Make ``GAME:llm:...`` available for every two-player OpenSpiel game registered so
    far (:mod:`mage_rl.runtime` calls it on import and after loading plugins)."""
    for game in ENVS.names():
        spec = ENVS.get(game)
        if spec.rules is None or spec.seats != 2:
            continue

        def factory(args: Any, game: str = game) -> Opponent:
            if len(args) != 1 or not args[0]:
                raise ValueError(
                    f"write the language-model opponent as {USAGE.format(game=game)}, say "
                    f"{game}:llm:smollm2 or {game}:llm:runs/my_run@10"
                )
            return LLMOpponent(args[0], game)

        register_opponent_factory(game, NAME, factory, USAGE.format(game=game))
