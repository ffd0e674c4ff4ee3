"""The text-environment interface shared by every task.

An environment plays one *episode* at a time from the agent's point of view: ``reset``
with a seed, then ``step`` with the model's raw response until ``done``. Opponent moves
and chance events happen inside ``step`` and ``reset``; the agent only sees text.

Rewards follow SPEC §3: the task reward is emitted at the last step of an episode
(win +10, loss -10, draw or unfinished 0). An invalid response leaves the game unchanged,
counts toward ``max_turns`` and is reported with a reason so that the prompt can show it.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mage_rl.envs.parsing import extract_action

Outcome = Literal["won", "lost", "draw", "unfinished"]
Protocol = Literal["replay", "fresh"]
PROTOCOLS: tuple[str, ...] = ("replay", "fresh")

WIN_REWARD = 10.0
LOSS_REWARD = -10.0


@dataclass
class StepInfo:
    """What happened on one step, beyond the observation text.

    Attributes:
        invalid: The response held no parsable, legal action; the game did not change.
        invalid_reason: Why, in words a prompt can show; empty when valid.
        action: The agent's action as the environment understood it (canonical text).
        outcome: Set when the episode ends: ``won``, ``lost``, ``draw`` or ``unfinished``.
        payoff: The game's own payoff at the end: chips won (+) or lost (-) in the poker
            games, +1 / -1 in Liar's Dice; ``None`` in games without one.
        feedback: End-of-episode feedback text (for Kuhn, the showdown's cards).
        events: Moves made during this step, the agent's and the opponent's, as text.
        extra: Game-specific details (revealed cards, final board, ...).
    """

    invalid: bool = False
    invalid_reason: str = ""
    action: str | None = None
    outcome: Outcome | None = None
    payoff: float | None = None
    feedback: str = ""
    events: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    """The result of :meth:`TextEnv.step`."""

    observation: str
    reward: float
    done: bool
    info: StepInfo


NO_ACTION_TAG = "no <action>...</action> tag found in the response"


class TextEnv(ABC):
    """A turn-based task the agent plays through text.

    Attributes:
        name: Environment name (``kuhn_poker``, ``tic_tac_toe``, ...).
        seat: The agent's seat for the current episode (0 = first to act).
        max_turns: Agent turns allowed per episode; past it the episode is unfinished.
        invalid_penalty: ``c_inv`` of SPEC §3 for this task.
        length_penalty: ``c_len`` of SPEC §3 for this task.
    """

    name: str
    seat: int
    max_turns: int
    invalid_penalty: float
    length_penalty: float
    turns: int = 0
    done: bool = False
    _initial_observation: str = ""
    _transcript: Sequence[str] = ()

    def _start_step(self, response: str, *, started: bool) -> tuple[StepInfo, str | None]:
        """The common start of :meth:`step`: refuse an episode that is over or was never
        ``started``, count the turn, and read the answer's action tag.

        Returns:
            A fresh :class:`StepInfo` and the tag's content (``None`` without a tag: the
            turn is invalid with :data:`NO_ACTION_TAG` as its reason).
        """
        if self.done or not started:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self.turns += 1
        return StepInfo(), extract_action(response)

    @abstractmethod
    def reset(self, seed: int) -> str:
        """Start an episode whose chance events are fixed by ``seed``; returns the
        first observation (the agent to move)."""

    @abstractmethod
    def step(self, response: str) -> StepResult:
        """Apply the model's raw response (the action is parsed out of it)."""

    @abstractmethod
    def legal_actions(self) -> list[str]:
        """The actions the agent may take now, as the text it should write."""

    @property
    @abstractmethod
    def task_description(self) -> str:
        """Rules and answer format, for the system part of a prompt."""

    @property
    def brief_description(self) -> str:
        """A short task description for the ``compact`` prompt template (small models).

        Defaults to :attr:`task_description`; environments may shorten it.
        """
        return self.task_description

    @property
    def brief_observation(self) -> str:
        """The current state in few tokens, for the ``compact`` prompt template.

        Empty by default: the template then shows the full observation.
        """
        return ""

    @property
    def brief_summary(self) -> str:
        """One short line about the finished episode for the ``compact`` template's history.

        Empty by default: the template then builds the line from the episode's first
        observation, moves and feedback.
        """
        return ""

    @property
    def initial_observation(self) -> str:
        """The observation the agent had at the start of the current episode.

        By default ``self._initial_observation``, which :meth:`reset` sets; an
        environment that keeps it elsewhere overrides this.
        """
        return self._initial_observation

    @property
    def transcript(self) -> list[str]:
        """Every move of the current episode so far, in order, as text.

        By default a copy of ``self._transcript``, which :meth:`reset` empties and
        :meth:`step` extends; an environment that keeps it elsewhere overrides this.
        """
        return list(self._transcript)


def derive_seed(*parts: Any) -> int:
    """A deterministic 63-bit seed from any printable parts.

    Used for episode seeds, opponent seeds and seat draws so that the same task seed
    always gives the same games, in every process, whatever Python's hash seed is.
    """
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def episode_seed(task_seed: int, episode: int, protocol: str) -> int:
    """The seed of episode ``episode`` of a meta-episode (SPEC §2, episode protocol).

    ``replay`` restarts every episode from the same state, so every episode uses the
    same seed; ``fresh`` gives each episode its own deal, still fixed by the task seed so
    that the G rollouts of a group see the same sequence of deals (SPEC §5).
    """
    if protocol == "replay":
        return derive_seed("episode", task_seed)
    if protocol == "fresh":
        return derive_seed("episode", task_seed, episode)
    raise ValueError(f"unknown episode protocol {protocol!r}; valid: {', '.join(PROTOCOLS)}")


def resolve_seat(seat: int | str, task_seed: int, num_players: int = 2) -> int:
    """Turn a seat setting into a seat index.

    Args:
        seat: ``0``/``"first"``, ``1``/``"second"``, or ``"sampled"`` (drawn uniformly
            from the task seed, so it is the same for every rollout of a group).
        task_seed: The task seed.
        num_players: Players in the game.
    """
    names = {"first": 0, "second": 1}
    if isinstance(seat, str):
        if seat == "sampled":
            return derive_seed("seat", task_seed) % num_players
        if seat in names:
            return names[seat]
        if seat.isdigit():
            seat = int(seat)
        else:
            raise ValueError(f"unknown seat {seat!r}; valid: first, second, sampled, 0, 1")
    if not 0 <= int(seat) < num_players:
        raise ValueError(f"seat {seat} out of range for a {num_players}-player game")
    return int(seat)


# -- how a task words its meta-episode (read by the prompt templates) --------------------

SAME_OPPONENT = (
    "You play several episodes in a row against the same opponent, whose strategy does "
    "not change. Use what earlier episodes show to win the later ones."
)


@dataclass(frozen=True)
class Wording:
    """How the prompts name what stays the same across the episodes of a meta-episode.

    The defaults speak of an opponent (the two-player games); a single-agent task
    words it its own way by returning a :class:`TaskText` as its task description.

    Attributes:
        same_task: Added to the system text when several episodes are played.
        setting: Completes "Earlier episodes ..." and "Episode k of K ... is over".
        reflect_focus: Completes "Diagnose what happened and ...".
    """

    same_task: str = SAME_OPPONENT
    setting: str = "against this opponent"
    reflect_focus: str = "what it reveals about the opponent's strategy"


class TaskText(str):
    """A task description (a plain string everywhere) that carries its own :class:`Wording`."""

    wording: Wording

    def __new__(cls, text: str, wording: Wording) -> TaskText:
        obj = super().__new__(cls, text)
        obj.wording = wording
        return obj


def wording_of(task_description: str) -> Wording:
    """The wording a task description asks for (the opponent wording by default)."""
    return getattr(task_description, "wording", None) or Wording()
