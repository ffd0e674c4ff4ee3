"""Records produced by rollouts and consumed by returns, advantages and the learner.

A :class:`Turn` is one LLM call (one training sample). A :class:`MetaEpisodeRecord` is
one meta-episode: K episodes against the same opponent, with every turn in time order.
Both are plain dataclasses of lists and scalars so that they serialize to JSON lines and
travel through LangGraph state without tensors.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

TurnKind = Literal["play", "reflect"]


@dataclass
class Turn:
    """One LLM call inside a meta-episode.

    Attributes:
        kind: ``"play"`` chooses an action; ``"reflect"`` writes a reflection between
            episodes.
        episode: Index k of the episode this turn belongs to (a reflect turn belongs to
            the episode it prepares, so its index is >= 1).
        step: Index of the turn inside its episode (0 for a reflect turn).
        prompt_ids: Token ids of the prompt (empty when the policy gives none).
        response_ids: Token ids of the response.
        logprobs: Sampling log-probs of ``response_ids``.
        text: The response text.
        anchor: The observation text the turn acted on (GiGPO anchor state); a reflect
            turn's anchor is ``"reflection"``.
        opponent: Opponent id of the meta-episode.
        invalid: Whether the response held no parsable, legal action (play) or no
            ``<remark>`` tag (reflect).
        invalid_reason: Why it was invalid, empty otherwise.
        response_length: Number of response tokens (or characters when no ids exist).
        max_response_length: The limit ``L_max`` the response was sampled under.
        finish_reason: ``"stop"`` or ``"length"``.
        reward: Task reward emitted by the environment after this turn (non-zero only on
            the last play turn of an episode).
        prompt_text: The rendered prompt messages, kept for inspection and tests.
        allowed: With constrained decoding, the allowed token ids of every response
            position (the learner scores the restricted softmax); empty otherwise.
    """

    kind: TurnKind
    episode: int
    step: int
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    anchor: str = ""
    opponent: str = ""
    invalid: bool = False
    invalid_reason: str = ""
    response_length: int = 0
    max_response_length: int = 0
    finish_reason: str = "stop"
    reward: float = 0.0
    prompt_text: list[dict[str, str]] = field(default_factory=list)
    allowed: list[list[int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        return cls(**data)


@dataclass
class EpisodeResult:
    """Outcome of one episode of a meta-episode.

    Attributes:
        index: Episode index k.
        outcome: ``"won"``, ``"lost"``, ``"draw"`` or ``"unfinished"``.
        reward: Sum of task rewards ``R_k``.
        payoff: Chip payoff for games that have one (Kuhn Poker), else ``None``.
        turns: Number of play turns taken.
        invalid_actions: Number of invalid play responses.
    """

    index: int
    outcome: str
    reward: float
    payoff: float | None = None
    turns: int = 0
    invalid_actions: int = 0


@dataclass
class MetaEpisodeRecord:
    """One meta-episode with its turns in time order.

    Attributes:
        uid: Group id: a deterministic function of (env, task seed, opponent, seat).
        rollout: Index of this rollout inside its group (0..G-1).
        env: Environment name.
        seed: Task seed (fixes the deal/board of every episode).
        opponent: Opponent id.
        seat: Agent seat (0 = first player).
        episodes: Per-episode results, in order.
        turns: Every LLM call, in time order.
        reflections: Reflection texts written between episodes.
        agent: Name of the agent (graph) that produced it.
    """

    uid: str
    rollout: int
    env: str
    seed: int
    opponent: str
    seat: int
    episodes: list[EpisodeResult] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    reflections: list[str] = field(default_factory=list)
    agent: str = "mage"

    @property
    def episode_rewards(self) -> list[float]:
        """``R_k`` for every episode played."""
        return [e.reward for e in self.episodes]

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetaEpisodeRecord:
        data = dict(data)
        data["episodes"] = [EpisodeResult(**e) for e in data.get("episodes", [])]
        data["turns"] = [Turn.from_dict(t) for t in data.get("turns", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, line: str) -> MetaEpisodeRecord:
        return cls.from_dict(json.loads(line))
