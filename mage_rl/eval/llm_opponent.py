"""The model half of ``GAME:llm:RUN_OR_MODEL[@ITER]`` opponents
(:mod:`mage_rl.envs.llm_opponent` is the light half every two-player game registers).

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
from typing import Any

from mage_rl.envs import make_env
from mage_rl.envs.llm_opponent import LLMOpponent, resolve_target
from mage_rl.envs.openspiel_env import OpenSpielEnv
from mage_rl.eval.exploitability import (
    ModelReader,
    PlaceholderOpponent,
    decision_at,
    read_policy,
)
from mage_rl.eval.played_config import played_config
from mage_rl.nodes.state import MetaEpisodeContext, graph_options
from mage_rl.policy.models import load_model


class _Player:
    """One frozen model at one seat of one game: its prompts and its exact strategy."""

    def __init__(self, target: str, game: str, seat: int) -> None:
        cfg = played_config(resolve_target(target), game, None, [])
        options = dataclasses.replace(graph_options(cfg), constrain_actions=True)
        env = make_env(game, PlaceholderOpponent(), seat=seat, max_turns=cfg.env.max_turns)
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
            decision = decision_at(self.env, self.ctx, state)
            self.table[key] = dict(read_policy([decision], self.reader)[decision.key])
        return self.table[key]


@lru_cache(maxsize=4)
def _load(model: str, dtype: str) -> tuple[Any, Any]:
    """One copy of each opponent model per process, shared by its seats."""
    return load_model(model, dtype=dtype)


@lru_cache(maxsize=16)
def _player(target: str, game: str, seat: int) -> _Player:
    return _Player(target, game, seat)


def install() -> None:
    """Give :class:`~mage_rl.envs.llm_opponent.LLMOpponent` its model half."""
    LLMOpponent.player = _player
