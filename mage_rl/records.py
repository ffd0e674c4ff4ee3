"""The data contract of the package: what rollouts produce and everything else reads.

A :class:`Turn` is one LLM call (one training sample). A :class:`MetaEpisodeRecord` is
one meta-episode: K episodes against the same opponent, with every turn in time order.
Both are plain dataclasses of lists and scalars so that they serialize to JSON lines and
travel through LangGraph state without tensors.

The deterministic group and anchor ids (SPEC §5) live here too, beside the records they
key: nodes, evaluation, the learner and the cluster backends all read them, and this
module imports nothing of the package.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any, Literal

TurnKind = Literal["play", "reflect", "call", "opponent"]
TURN_KINDS: tuple[str, ...] = ("play", "reflect", "call")
"""The kinds of the agent's own calls (``MetaEpisodeRecord.turns``). ``play``: the acting
call of a step (its response is what the environment consumes). ``reflect``: a call
between two episodes (a reflection). ``call``: any other, non-acting call made during an
episode's step (a plan, a critique, a tool call); SPEC §4."""

OPPONENT_KIND = "opponent"
"""The kind of a language-model opponent's call (``MetaEpisodeRecord.opponent_calls``)."""

REFLECTION_ANCHOR = "reflection"
"""Anchor text of every reflect turn (SPEC §5: ``"reflection"`` plus the opponent id)."""

ID_LENGTH = 16


def _digest(kind: str, *parts: object) -> str:
    # JSON keeps the parts apart unambiguously ("a|b", "c" vs "a", "b|c") and maps None to
    # null, so a missing opponent or episode never collides with a string "None".
    payload = json.dumps([kind, *parts], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:ID_LENGTH]


def group_id(env: str, seed: int, opponent: str | None, seat: int) -> str:
    """Deterministic group (uid) id of a task instance.

    Args:
        env: Environment name.
        seed: Task seed (fixes every deal or board of the meta-episode).
        opponent: Opponent id; ``None`` for ``mixed`` grouping, where a group spans
            opponents.
        seat: Agent seat.

    Returns:
        A 16-digit sha1 hex string.
    """
    return _digest("group", env, int(seed), opponent, int(seat))


def anchor_id(
    group: str, text: str, opponent: str | None, episode: int | None, node: str = ""
) -> str:
    """Deterministic anchor-group id of a turn (GiGPO anchor state, SPEC §4-5).

    Args:
        group: Id of the group the turn belongs to (anchor groups never cross groups).
        text: Observation text the turn acted on, or ``"reflection"``.
        opponent: Opponent id; ``None`` under ``mixed`` grouping.
        episode: Episode index under a ``local`` anchor, ``None`` under a ``global`` one.
        node: Name of the graph node that made the call, so that calls of different
            nodes on the same observation never share an anchor group (SPEC §4).

    Returns:
        A 16-digit sha1 hex string.
    """
    episode = None if episode is None else int(episode)
    return _digest("anchor", group, text, opponent, episode, node)


def plain_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values shared rather than deep-copied.

    ``dataclasses.asdict`` copies every token list of a turn on every graph step; the
    values here are fresh lists made for one turn, so sharing them is safe and cheap.
    """
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass
class Turn:
    """One LLM call inside a meta-episode.

    Attributes:
        kind: ``"play"``: the acting call of a step (the environment consumes its
            response); ``"reflect"``: a call between episodes; ``"call"``: any other
            call of a step (see :data:`TURN_KINDS`).
        episode: Index k of the episode this turn belongs to (a reflect turn belongs to
            the episode it prepares, so its index is >= 1).
        step: Index of the environment step inside its episode that the call belongs to
            (0 for a reflect turn).
        prompt_ids: Token ids of the prompt (empty when the policy gives none).
        response_ids: Token ids of the response.
        logprobs: Sampling log-probs of ``response_ids``.
        text: The response text.
        anchor: The observation text the turn acted on (GiGPO anchor state); a reflect
            turn's anchor is ``"reflection"``.
        node: Name of the graph node that made the call (``play``, ``reflect``, or a
            user's node); part of the anchor key.
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
        trained: Whether the learner trains on this call (a node can opt a call out;
            it still takes part in credit assignment).
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
    node: str = ""
    trained: bool = True

    @property
    def acting(self) -> bool:
        """Whether this is the acting call of its step (SPEC §4)."""
        return self.kind == "play"

    def to_dict(self) -> dict[str, Any]:
        # Fresh top-level lists, shared elements: ``asdict`` deep-copies every token id
        # one by one, which made it a large share of a tiny-model rollout's time.
        return {k: list(v) if isinstance(v, list) else v for k, v in plain_fields(self).items()}

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
        payoff: The game's payoff where it has one (chips in Kuhn Poker and Leduc
            Hold'em, +1 / -1 in Liar's Dice), else ``None``.
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
        conversation: In the conversation layout, the meta-episode's chat as
            ``{"ids": [...], "segments": [[start, end, turn_index], ...]}`` (see
            :class:`~mage_rl.rl.conversation.ConversationTrace`): the learner trains it as
            one sequence. ``None`` in the re-rendered layout.
        opponent_calls: The calls of a language-model opponent (``GAME:llm:...``,
            ``GAME:self``), kind ``"opponent"``, in time order: its prompt, answer,
            log-probs, the information state as ``anchor``, and on the last call of a
            hand that hand's reward for the opponent's seat. Trained only when the
            opponent is the current policy (``trained``; :mod:`mage_rl.rl.selfplay`).
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
    conversation: dict[str, Any] | None = None
    opponent_calls: list[Turn] = field(default_factory=list)

    @property
    def episode_rewards(self) -> list[float]:
        """``R_k`` for every episode played."""
        return [e.reward for e in self.episodes]

    def to_json(self) -> str:
        data = plain_fields(self)
        data["episodes"] = [plain_fields(e) for e in self.episodes]
        data["turns"] = [plain_fields(t) for t in self.turns]
        data["opponent_calls"] = [plain_fields(t) for t in self.opponent_calls]
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetaEpisodeRecord:
        data = dict(data)
        data["episodes"] = [EpisodeResult(**e) for e in data.get("episodes", [])]
        data["turns"] = [Turn.from_dict(t) for t in data.get("turns", [])]
        data["opponent_calls"] = [Turn.from_dict(t) for t in data.get("opponent_calls", [])]
        return cls(**data)

    @classmethod
    def from_json(cls, line: str) -> MetaEpisodeRecord:
        return cls.from_dict(json.loads(line))
