"""A game played by a client: the messages that carry it and the environment that reads them.

``mage serve RUN --agent`` runs a trained agent's graph, which resets and steps a
:class:`~mage_rl.envs.base.TextEnv`. The game itself lives with the client; each request
carries one *environment message* (the ``env`` field of the request body) that says what
the game shows:

* a **start** message opens an episode: its first observation, the legal actions and, on
  a session's first message, the game's texts (``game``);
* a **result** message answers the agent's last action: reward, whether the episode is
  over and how it ended, the feedback and moves; while the episode goes on, also the next
  observation and legal actions.

:func:`start_message` and :func:`result_message` build both from a local environment, so
a client that plays one of the library's games sends exactly what the environment would
show the agent in training. On the server, :class:`RemoteEnv` stands where the
environment stands in the graph: its ``reset`` and ``step`` return awaitables that resolve
when the client's next message arrives (the graph's nodes await them).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mage_rl.envs.base import StepInfo, StepResult, TaskText, TextEnv, Wording, wording_of

MessageKind = Literal["start", "result"]

# Every text of a message is bounded, so a session's memory and each prompt built from
# it are bounded too; a number is finite (JSON's 1e400 parses as infinity).
Action = Annotated[str, Field(min_length=1, max_length=1_000)]
Event = Annotated[str, Field(max_length=10_000)]
Phrase = Annotated[str, Field(max_length=10_000)]
Number = Annotated[float, Field(allow_inf_nan=False)]


class GameTexts(BaseModel):
    """The texts of a game that do not change within a session."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200)
    task_description: str = Field(max_length=100_000)
    brief_description: str = Field(default="", max_length=100_000)
    max_turns: int = Field(default=32, ge=1, le=10_000)
    wording: dict[str, Phrase] | None = Field(default=None, max_length=8)


class StepOutcome(BaseModel):
    """The result of the agent's last action, as the client's game computed it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    reward: Number = 0.0
    done: bool = False
    outcome: Literal["won", "lost", "draw", "unfinished"] | None = None
    payoff: Number | None = None
    feedback: str = Field(default="", max_length=100_000)
    events: list[Event] = Field(default_factory=list, max_length=1_000)
    invalid: bool = False
    invalid_reason: str = Field(default="", max_length=10_000)
    brief_summary: str = Field(default="", max_length=100_000)


class EnvMessage(BaseModel):
    """One environment message (the ``env`` field of an agent request).

    ``kind`` ``start``: ``observation`` and ``legal_actions`` of an episode's first state
    (``game`` too on a session's first message). ``kind`` ``result``: ``result``, and while
    the episode goes on (``result.done`` false) the next ``observation`` and
    ``legal_actions``.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    kind: MessageKind
    observation: str = Field(default="", max_length=100_000)
    brief_observation: str = Field(default="", max_length=100_000)
    legal_actions: list[Action] = Field(default_factory=list, max_length=1_000)
    result: StepOutcome | None = None
    game: GameTexts | None = None

    def problem(self) -> str:
        """What makes this message unusable, in words; '' when it is fine."""
        seen: set[str] = set()
        for action in self.legal_actions:
            if action in seen:
                return f"legal_actions lists {action[:80]!r} twice; list each action once"
            seen.add(action)
        if self.kind == "start":
            if self.result is not None:
                return "a start message carries no result; send the result first"
            if not self.legal_actions:
                return "a start message needs the legal_actions of the first state"
            known = {f.name for f in fields(Wording)}
            unknown = sorted(set((self.game.wording or {}) if self.game else ()) - known)
            if unknown:
                return f"game.wording takes {sorted(known)}, not {unknown}"
            return ""
        if self.result is None:
            return "a result message needs result (reward, done, outcome, ...)"
        if self.game is not None:
            return "game is sent once, with a session's first start message"
        return self._result_problem()

    def _result_problem(self) -> str:
        assert self.result is not None
        if not self.result.done and not self.legal_actions:
            return "while the episode goes on, a result message needs the next legal_actions"
        return ""


def parse_env_message(data: Any) -> EnvMessage:
    """An :class:`EnvMessage` from JSON data.

    Raises:
        ValueError: What is wrong with it, naming the field.
    """
    try:
        message = EnvMessage.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "env"
        raise ValueError(f"env.{where}: {first['msg']}") from None
    problem = message.problem()
    if problem:
        raise ValueError(f"env: {problem}")
    return message


def game_texts(env: TextEnv) -> dict[str, Any]:
    """The ``game`` part of a session's first message, read from a local environment."""
    return {
        "name": env.name,
        "task_description": str(env.task_description),
        "brief_description": env.brief_description,
        "max_turns": env.max_turns,
        "wording": asdict(wording_of(env.task_description)),
    }


def start_message(env: TextEnv, observation: str, *, first: bool = False) -> dict[str, Any]:
    """The message that opens an episode of ``env`` (just reset, returning ``observation``);
    ``first`` adds the game's texts, as a session's first message must."""
    message: dict[str, Any] = {
        "kind": "start",
        "observation": observation,
        "brief_observation": env.brief_observation,
        "legal_actions": env.legal_actions(),
    }
    if first:
        message["game"] = game_texts(env)
    return message


def result_message(env: TextEnv, result: StepResult) -> dict[str, Any]:
    """The message that answers the agent's action with ``env.step``'s ``result``."""
    info = result.info
    message: dict[str, Any] = {
        "kind": "result",
        "result": {
            "reward": float(result.reward),
            "done": bool(result.done),
            "outcome": info.outcome,
            "payoff": None if info.payoff is None else float(info.payoff),
            "feedback": info.feedback,
            "events": list(info.events),
            "invalid": bool(info.invalid),
            "invalid_reason": info.invalid_reason,
            "brief_summary": env.brief_summary if result.done else "",
        },
    }
    message["observation"] = result.observation
    if not result.done:
        message["brief_observation"] = env.brief_observation
        message["legal_actions"] = env.legal_actions()
    return message


@dataclass
class AgentAction:
    """The agent acted: ``text`` is its response, which the client's game applies."""

    text: str


@dataclass
class EpisodeOver:
    """The agent has taken in an episode's end (and reflected, if it does) and waits for
    the next episode's start message."""


@dataclass
class RemoteEnv(TextEnv):
    """The client's game as the agent's graph sees it (see the module docstring).

    ``reset`` and ``step`` are coroutines: each tells the waiting request what the agent
    did (:attr:`outbox`), then waits for the client's next message (:attr:`inbox`).
    ``expecting`` says which kind of message the graph waits for.
    """

    game: GameTexts
    inbox: asyncio.Queue[EnvMessage] = field(default_factory=asyncio.Queue)
    outbox: asyncio.Queue[AgentAction | EpisodeOver] = field(default_factory=asyncio.Queue)
    expecting: MessageKind = "start"
    _current: EnvMessage | None = None
    _summary: str = ""
    _episodes: int = 0

    def __post_init__(self) -> None:
        self.name = self.game.name
        self.seat = 0
        self.max_turns = self.game.max_turns
        self.invalid_penalty = 0.0
        self.length_penalty = 0.0
        self._wording = Wording(**(self.game.wording or {}))

    async def reset(self, seed: int) -> str:  # type: ignore[override]
        if self._episodes:
            await self.outbox.put(EpisodeOver())
        self._episodes += 1
        self.expecting = "start"
        message = await self.inbox.get()
        self._current = message
        self.done = False
        self.turns = 0
        self._initial_observation = message.observation
        return message.observation

    async def step(self, response: str) -> StepResult:  # type: ignore[override]
        await self.outbox.put(AgentAction(response))
        self.expecting = "result"
        message = await self.inbox.get()
        outcome = message.result
        assert outcome is not None  # checked by EnvMessage.problem before it is queued
        self._current = message
        self.turns += 1
        self.done = outcome.done
        self._summary = outcome.brief_summary
        info = StepInfo(
            invalid=outcome.invalid,
            invalid_reason=outcome.invalid_reason,
            outcome=outcome.outcome if outcome.done else None,
            payoff=outcome.payoff,
            feedback=outcome.feedback,
            events=list(outcome.events),
        )
        if outcome.done and info.outcome is None:
            info.outcome = "unfinished"
        return StepResult(message.observation, outcome.reward, outcome.done, info)

    def legal_actions(self) -> list[str]:
        return list(self._current.legal_actions) if self._current else []

    @property
    def task_description(self) -> str:
        return TaskText(self.game.task_description, self._wording)

    @property
    def brief_description(self) -> str:
        return self.game.brief_description

    @property
    def brief_observation(self) -> str:
        return self._current.brief_observation if self._current else ""

    @property
    def brief_summary(self) -> str:
        return self._summary
