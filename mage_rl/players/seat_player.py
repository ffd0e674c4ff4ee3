"""The model half of the language-model opponents ``GAME:llm:RUN_OR_MODEL[@ITER]`` and
``GAME:self`` (:mod:`mage_rl.envs.llm_opponent` is the light half every two-player game
registers).

A model plays the other seat of a two-player OpenSpiel game as it plays its own first
episode: the prompt its run's agent sees there (built-in ``play`` node, the run's prompt
template and layout; a bare model gets ``mage eval``'s defaults), constrained decoding
over the legal answers, the run's sampling temperature. Under constrained decoding that
agent plays an exact distribution at each information state, which
:class:`~mage_rl.players.model_reader.ModelReader` reads in one scoring pass (the engine's
own restricted softmax); the opponent draws its answer from it token by token with its
own seeded generator, as the engine would, and keeps the call (prompt ids, answer ids,
log-probs, allowed tokens). So a move costs no generation, a frozen opponent's table is
read once per information state and shared by every game of the process, and the
oracles (``mage oracle``, ``mage exploitability``, the training report) get its exact
``action_probabilities``.

``GAME:self`` is the same player on the engine's own model
(:class:`~mage_rl.rl.selfplay.SelfPlay`, installed by the trainer), drawing from the
run's exploration mixture; what it read is forgotten whenever the weights change.

What it is not (yet): an opponent that remembers earlier episodes of the meta-episode
(every hand is its first).

``RUN_OR_MODEL`` is a training run (its newest checkpoint, or ``RUN@N`` for iteration
``N``), a checkpoint folder, or any model ``load_model`` knows (``tiny``, ``smollm2``, an
HF folder). The spec may hold no ``:``, ``,`` or ``=`` (population syntax).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from mage_rl.config import TrainConfig
from mage_rl.envs import make_env
from mage_rl.envs.llm_opponent import LLMOpponent, resolve_target
from mage_rl.envs.openspiel_env import OpenSpielEnv
from mage_rl.envs.opponents import PlaceholderOpponent
from mage_rl.nodes.state import MetaEpisodeContext, graph_options
from mage_rl.players.model_reader import ModelReader, ReadDecision
from mage_rl.players.played_config import played_config
from mage_rl.players.tree_decisions import decision_at, read_policy
from mage_rl.policy.constrained import allowed_next, is_complete, mixture_logprobs
from mage_rl.policy.models import load_model
from mage_rl.records import OPPONENT_KIND, Turn


class SeatPlayer:
    """One model at one seat of one game, playing as ``cfg``'s agent plays episode 1.

    Args:
        cfg: The config whose play settings it uses (prompt, layout, temperature);
            constrained decoding is always on.
        game: The environment name.
        seat: The seat it plays.
        model: The causal LM (the engine's own for ``self``), with ``tokenizer``.
        explore: The uniform share of the exploration mixture its answers are drawn from
            (``policy.explore`` for ``self``; 0 for a frozen opponent).
    """

    def __init__(
        self, cfg: TrainConfig, game: str, seat: int, model: Any, tokenizer: Any,
        explore: float = 0.0,
    ) -> None:  # fmt: skip
        options = dataclasses.replace(graph_options(cfg), constrain_actions=True)
        env = make_env(game, PlaceholderOpponent(), seat=seat, max_turns=cfg.env.max_turns)
        assert isinstance(env, OpenSpielEnv)
        env.reset(0)
        self.env = env
        self.ctx = MetaEpisodeContext(env=env, llm=None, options=options)  # type: ignore[arg-type]
        self.reader = ModelReader(model, tokenizer, cfg.policy.temperature)
        self.explore = explore
        self.reads: dict[str, ReadDecision] = {}

    def read(self, state: Any) -> ReadDecision:
        """The decision at ``state`` as this seat sees it, read once per information state."""
        key = state.information_state_string(self.env.seat)
        if key not in self.reads:
            self.reads[key] = self.reader.read([decision_at(self.env, self.ctx, state)])[0]
        return self.reads[key]

    def probabilities(self, state: Any) -> dict[int, float]:
        """The model's exact distribution over the legal actions at ``state``."""
        read = self.read(state)
        table = read_policy([read.decision], lambda _: [read.probabilities])
        return dict(table[read.decision.key])

    def play(self, state: Any, rng: np.random.Generator) -> tuple[int, Turn]:
        """Draw an answer token by token, as the engine samples a constrained request
        (from ``(1 - explore) * p + explore * uniform`` where several tokens are
        allowed), and return its action with the call (kind ``"opponent"``)."""
        read = self.read(state)
        response: list[int] = []
        logprobs: list[float] = []
        allowed_ids: list[list[int]] = []
        while not is_complete(read.answers, response):
            allowed = allowed_next(read.answers, response)
            token, logprob = allowed[0], 0.0
            if len(allowed) > 1:
                branch = read.branches[tuple(response)]
                policy = torch.tensor([branch[t] for t in allowed], dtype=torch.float64)
                logq = mixture_logprobs(policy.log_softmax(0), len(allowed), self.explore)
                q = logq.exp().numpy()
                k = int(rng.choice(len(allowed), p=q / q.sum()))
                token, logprob = allowed[k], float(logq[k])
            response.append(token)
            logprobs.append(logprob)
            allowed_ids.append(allowed)
        index = read.answers.index(response)
        decision = read.decision
        messages = [dict(m) for m in decision.messages]
        for reply, message in decision.turns:
            messages += [{"role": "assistant", "content": reply}, dict(message)]
        call = Turn(
            kind=OPPONENT_KIND, episode=0, step=0, prompt_ids=list(read.prompt_ids),
            response_ids=response, logprobs=logprobs, text=decision.choices[index],
            anchor=decision.key, response_length=len(response), prompt_text=messages,
            allowed=allowed_ids, node=OPPONENT_KIND,
        )  # fmt: skip
        return decision.actions[index], call

    def forget(self) -> None:
        """Drop what was read (the weights changed)."""
        self.reads.clear()


@lru_cache(maxsize=4)
def _load(model: str, dtype: str) -> tuple[Any, Any]:
    """One copy of each opponent model per process, shared by its seats."""
    return load_model(model, dtype=dtype)


@lru_cache(maxsize=16)
def _player(target: str, game: str, seat: int) -> SeatPlayer:
    cfg = played_config(resolve_target(target), game, None, [])
    model, tokenizer = _load(cfg.policy.model, cfg.policy.dtype)
    return SeatPlayer(cfg, game, seat, model, tokenizer)


def install() -> None:
    """Give :class:`~mage_rl.envs.llm_opponent.LLMOpponent` its model half."""
    LLMOpponent.player = _player
