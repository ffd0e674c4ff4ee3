"""Self-play credit: the calls of ``GAME:self`` become samples of their own seat.

When the opponent is the policy being trained (``GAME:self``,
:class:`~mage_rl.envs.llm_opponent.SelfOpponent`), its calls are samples too (SPEC §10).
It plays every hand as the agent plays a first episode (nothing of the earlier hands is
in its prompt), so its objective is the hand itself: each hand it played becomes a
one-episode record of its seat, whose calls are its calls of that hand and whose reward
is that hand's reward for its seat. Credit then runs through the same estimator as the
agent's (:func:`~mage_rl.rl.advantages.credit_parts`), with groups of their own (a
per-role baseline, as SPIRAL's role-conditioned advantages, arXiv 2506.24119):

- the group of a seat record is (task, hand, seat): the G rollouts of a task deal the
  same cards in hand k (the task seed fixes them), so its episode-level baseline
  compares the self seat's play on one deal, never mixing it with the agent's seat;
- its anchor key is the information state the call acted on (the ``anchor`` of the
  call) and the node name ``opponent``, so its step-level baseline pools the self seat's
  answers at one information state of that deal.

A frozen opponent (``GAME:llm:...``) keeps its calls in the records too, untrained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mage_rl.config import RunConfig, TrainConfig
from mage_rl.envs import Population
from mage_rl.envs.llm_opponent import SelfOpponent, is_self
from mage_rl.players.seat_player import SeatPlayer
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, group_id

SELF_AGENT = "self"
"""The ``agent`` of a seat record."""


def seat_records(records: Sequence[MetaEpisodeRecord]) -> list[MetaEpisodeRecord]:
    """One record per hand in which a trained opponent made calls, in record order.

    Args:
        records: The agent's meta-episodes of one batch.

    Returns:
        Records of the opponent's seat: one episode each (index 0, the hand's reward and
        outcome for that seat), turns of kind ``play`` and node ``opponent``.
    """
    out = []
    for record in records:
        hands: dict[int, list] = {}
        for call in record.opponent_calls:
            if call.trained:
                hands.setdefault(call.episode, []).append(call)
        for hand, calls in sorted(hands.items()):
            reward = sum(c.reward for c in calls)
            finished = hand < len(record.episodes) and record.episodes[hand].outcome != "unfinished"
            outcome = (
                ("won" if reward > 0 else "lost" if reward < 0 else "draw")
                if finished
                else "unfinished"
            )
            opponent = f"{record.agent}@episode{hand}"
            out.append(
                MetaEpisodeRecord(
                    uid=group_id(
                        record.env, record.seed, f"{record.uid}/{opponent}", 1 - record.seat
                    ),
                    rollout=record.rollout,
                    env=record.env,
                    seed=record.seed,
                    opponent=opponent,
                    seat=1 - record.seat,
                    episodes=[EpisodeResult(0, outcome, reward, turns=len(calls))],
                    turns=[
                        dataclasses.replace(c, kind="play", episode=0, step=j, opponent=opponent)
                        for j, c in enumerate(calls)
                    ],
                    agent=SELF_AGENT,
                )
            )
    return out


def plays_self(cfg: RunConfig) -> bool:
    """Whether the config's population holds ``GAME:self``."""
    population = Population.parse(cfg.env.population, game=cfg.env.name)
    return any(is_self(spec) for spec in population.specs)


class SelfPlay:
    """The current policy as ``GAME:self``: one :class:`SeatPlayer` per (game, seat) on the
    engine's model, forgotten whenever the weights change.

    Args:
        cfg: The run's config (its play settings and ``policy.explore``).
        model: The engine's model (the weights the agent samples from).
        tokenizer: Its tokenizer.
    """

    def __init__(self, cfg: TrainConfig, model: Any, tokenizer: Any) -> None:
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.players: dict[tuple[str, int], SeatPlayer] = {}

    def __call__(self, game: str, seat: int) -> SeatPlayer:
        if (game, seat) not in self.players:
            self.players[(game, seat)] = SeatPlayer(
                self.cfg, game, seat, self.model, self.tokenizer, self.cfg.policy.explore
            )
        return self.players[(game, seat)]

    def forget(self) -> None:
        for player in self.players.values():
            player.forget()

    def install(self) -> None:
        """Make this the policy every ``GAME:self`` opponent of the process plays."""
        SelfOpponent.player = self

    def uninstall(self) -> None:
        """Undo :meth:`install` (the run is over)."""
        if SelfOpponent.player is self:
            SelfOpponent.player = None
