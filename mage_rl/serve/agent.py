"""A trained agent behind the OpenAI API: one session per client game (``mage serve RUN --agent``).

The server runs the agent's own graph, the one its run trained (built-in or a plugin's,
with its prompts, layout, constrained decoding, token limits and reflections), every call
of it answered by the served weights. A *session* is one meta-episode of one client: the
request's ``user`` field names it, and its first request starts the graph as a task on
the server's event loop. The graph plays against a :class:`~mage_rl.envs.remote.RemoteEnv`,
so each request hands the client's environment message to the waiting graph and returns
what the graph does next:

* the agent's response, when it acts (the assistant message the client's game applies);
* an empty answer with ``episode_done``, when an episode's end has been taken in (and the
  reflection written, if the agent writes one); the client then sends the next start;
* an empty answer with ``meta_done``, when the meta-episode is over (K episodes, or a win
  under the run's stop rule); the session ends and its name may start a new one.

Sessions are isolated (each has its graph state, memory, chat model and sampling seed),
at most ``max_sessions`` live at once, one request each at a time, and a session left
idle for ``idle_s`` seconds is closed; a later result for it is refused as expired. A
session's state is bounded by its meta-episode: K episodes of at most ``max_turns``
steps, each message's texts bounded in size (:mod:`mage_rl.envs.remote`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from mage_rl.envs.parsing import extract_remark
from mage_rl.envs.remote import AgentAction, EnvMessage, RemoteEnv, parse_env_message
from mage_rl.graphs import MetaEpisodeGraph
from mage_rl.nodes.tracing import Tracer
from mage_rl.serve.protocol import APIError

logger = logging.getLogger(__name__)

DEFAULT_MAX_SESSIONS = 256
DEFAULT_IDLE_S = 600.0
MAX_TURNS_CAP = 1_000


@dataclass
class AgentReply:
    """What one request gets back (see the module docstring)."""

    content: str
    session: str
    episode: int
    episode_done: bool
    meta_done: bool
    calls: list[dict[str, Any]]
    reflections: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def extra(self) -> dict[str, Any]:
        """The ``mage`` field of the response body."""
        return {
            "session": self.session,
            "episode": self.episode,
            "episode_done": self.episode_done,
            "meta_done": self.meta_done,
            "calls": self.calls,
            "reflections": self.reflections,
        }


@dataclass
class Session:
    """One client's meta-episode: its graph task, its environment and its trace."""

    name: str
    env: RemoteEnv
    tracer: Tracer
    task: asyncio.Task[Any]
    last_used: float
    sent: int = 0
    messages: int = 0
    busy: bool = False


def call_view(turn: Any, acting: bool = False) -> dict[str, Any]:
    """One model call of the agent as the response's ``mage.calls`` lists it (``acting``:
    it is the call whose answer goes to the game now, which the trace marks ``play``
    once the game has stepped)."""
    return {
        "node": turn.node,
        "kind": "play" if acting else turn.kind,
        "episode": turn.episode,
        "step": turn.step,
        "messages": list(turn.prompt_text),
        "text": turn.text,
        "invalid": turn.invalid,
        "prompt_tokens": len(turn.prompt_ids),
        "completion_tokens": len(turn.response_ids),
    }


class AgentSessions:
    """The sessions of one served agent.

    Args:
        graph: The agent's meta-episode graph.
        chat_for: Makes a session's chat model from its sampling settings
            (``temperature``, ``top_p``, ``top_k``, ``seed``; ``None`` where the request
            gives none).
        name: The agent's model name.
        max_sessions: Most sessions alive at once; one more is refused (429).
        idle_s: Seconds a session may wait for its client before it is closed.
        clock: Monotonic time, replaceable in tests.
    """

    def __init__(
        self,
        graph: MetaEpisodeGraph,
        chat_for: Callable[..., Any],
        *,
        name: str,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        idle_s: float = DEFAULT_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"the session limit must be at least 1, got {max_sessions}")
        if idle_s <= 0:
            raise ValueError(f"the idle time of a session must be > 0 seconds, got {idle_s}")
        self.graph = graph
        self.chat_for = chat_for
        self.name = name
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()

    @property
    def episodes(self) -> int:
        return self.graph.options.num_episodes

    def __len__(self) -> int:
        return len(self._sessions)

    # -- requests ----------------------------------------------------------------------

    async def turn(
        self, name: str | None, message: EnvMessage, sampling: dict[str, Any]
    ) -> AgentReply:
        """Hand ``message`` to session ``name`` (starting it if it is new) and wait for
        the agent's next move.

        Raises:
            APIError: 400 for a message the session does not wait for or a missing
                ``user``, 409 while the session has a request in flight, 410 for an
                expired session, 429 at the session limit, 500 when the graph fails.
        """
        if not name:
            raise APIError(
                400,
                f"a request to the agent {self.name!r} names its session in the 'user' field "
                "(one session per game the client plays)",
                param="user",
            )
        self.expire_idle()
        session = self._sessions.get(name)
        if session is None:
            session = self._start(name, message, sampling)
        elif session.busy:
            raise APIError(
                409,
                f"session {name!r} has a request in flight; send its next message when "
                "the agent has answered",
                param="user",
                code="session_busy",
            )
        self._check_order(session, message)
        session.messages += 1
        session.busy = True
        try:
            return await self._exchange(session, message)
        except asyncio.CancelledError:
            # The client left while the agent worked: what it would have answered is
            # lost, so the session cannot go on.
            self._close(name)
            raise
        finally:
            session.busy = False
            session.last_used = self.clock()

    def _start(self, name: str, message: EnvMessage, sampling: dict[str, Any]) -> Session:
        if message.kind != "start" or message.game is None:
            if name in self._expired:
                raise APIError(
                    410,
                    f"session {name!r} expired after {self.idle_s:g} s without a request; "
                    "start a new one with a start message that carries game",
                    param="user",
                    code="session_expired",
                )
            raise APIError(
                400,
                f"there is no session {name!r}: a session starts with a start message that "
                "carries game (env.kind 'start', env.game)",
                param="env",
            )
        if len(self._sessions) >= self.max_sessions:
            raise APIError(
                429,
                f"the agent has {len(self._sessions)} sessions open, its limit; finish or "
                f"abandon one (sessions close after {self.idle_s:g} s idle)",
                param="user",
                code="too_many_sessions",
            )
        game = message.game
        if game.max_turns > MAX_TURNS_CAP:
            raise APIError(400, f"env.game.max_turns is at most {MAX_TURNS_CAP}", param="env")
        self._expired.pop(name, None)
        env = RemoteEnv(game)
        tracer = Tracer("client")
        llm = self.chat_for(**sampling)
        seed = sampling.get("seed")
        run = self.graph.run(env, llm, task_seed=0 if seed is None else int(seed),
                             opponent="client", tracer=tracer)  # fmt: skip
        task = asyncio.ensure_future(run)
        session = Session(name, env, tracer, task, self.clock())
        self._sessions[name] = session
        logger.info("agent %s: session %r started (%d open)", self.name, name, len(self))
        return session

    def _check_order(self, session: Session, message: EnvMessage) -> None:
        env = session.env
        if message.kind != env.expecting:
            after = "its action" if env.expecting == "result" else "the end of an episode"
            raise APIError(
                400,
                f"session {session.name!r} waits for a {env.expecting} message after {after}, "
                f"got a {message.kind} message",
                param="env",
            )
        if message.game is not None and session.messages:
            raise APIError(400, "game is sent once, with a session's first message", param="env")
        result = message.result
        if result is not None and not result.done and env.turns + 1 >= env.max_turns:
            raise APIError(
                400,
                f"the episode has reached the game's max_turns ({env.max_turns}); this "
                "result must end it (done true)",
                param="env",
            )

    async def _exchange(self, session: Session, message: EnvMessage) -> AgentReply:
        env = session.env
        await env.inbox.put(message)
        out = asyncio.ensure_future(env.outbox.get())
        try:
            await asyncio.wait({out, session.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not out.done():
                out.cancel()
        if out.done() and not out.cancelled():
            event = out.result()
            if isinstance(event, AgentAction):
                return self._reply(session, event.text, episode_done=False, meta_done=False)
            return self._reply(session, "", episode_done=True, meta_done=False)
        self._close(session.name)
        error = session.task.exception()
        if error is not None:
            logger.error("agent %s: session %r failed", self.name, session.name,
                         exc_info=error)  # fmt: skip
            raise APIError(
                500, f"the agent's graph failed in session {session.name!r}: {error}",
                "server_error",
            )  # fmt: skip
        return self._reply(session, "", episode_done=True, meta_done=True)

    def _reply(
        self, session: Session, content: str, *, episode_done: bool, meta_done: bool
    ) -> AgentReply:
        turns = session.tracer.turns
        new = turns[session.sent :]
        acting = None if episode_done or meta_done else session.tracer.pending_acting()
        session.sent = len(turns)
        done_episodes = session.tracer.episode
        episode = done_episodes - 1 if episode_done or meta_done else done_episodes
        state = session.task.result() if meta_done else None
        memory = list(state.get("memory", [])) if state else self._memory(session)
        return AgentReply(
            content=content,
            session=session.name,
            episode=max(episode, 0),
            episode_done=episode_done,
            meta_done=meta_done,
            calls=[call_view(t, t is acting) for t in new],
            reflections=memory,
            prompt_tokens=sum(len(t.prompt_ids) for t in new),
            completion_tokens=sum(len(t.response_ids) for t in new),
        )

    @staticmethod
    def _memory(session: Session) -> list[str]:
        """The reflections written so far (the reflect calls' remarks)."""
        out = []
        for turn in session.tracer.turns:
            if turn.kind == "reflect" and not turn.invalid:
                remark = extract_remark(turn.text)
                if remark:
                    out.append(remark)
        return out

    # -- housekeeping ------------------------------------------------------------------

    def expire_idle(self) -> None:
        """Close every session idle for longer than ``idle_s``."""
        now = self.clock()
        for name, session in list(self._sessions.items()):
            if not session.busy and now - session.last_used > self.idle_s:
                self._close(name)
                self._expired[name] = None
                while len(self._expired) > 16 * self.max_sessions:
                    self._expired.popitem(last=False)
                logger.info("agent %s: session %r expired", self.name, name)

    def _close(self, name: str) -> None:
        session = self._sessions.pop(name, None)
        if session is not None and not session.task.done():
            session.task.cancel()

    async def aclose(self) -> None:
        """Stop every session's graph."""
        tasks = [s.task for s in self._sessions.values()]
        for name in list(self._sessions):
            self._close(name)
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


# -- the agent's requests and answers ----------------------------------------------------


def env_message(body: Any, agent: str) -> EnvMessage:
    """The environment message of a chat request to the agent: its ``env`` field, with
    the last user message as the observation and the first system message as the task
    description where ``env`` leaves them empty.

    Raises:
        APIError: 400 when the request has no usable ``env`` or asks for what the agent
            does not return.
    """
    if body.env is None:
        raise APIError(
            400,
            f"a request to the agent {agent!r} carries the game's message in the 'env' "
            "field (docs/serving.md, 'Serving an agent'); ask the plain model by its "
            "own name for completions of free prompts",
            param="env",
        )
    if body.n != 1:
        raise APIError(400, "the agent gives one answer per request; leave n at 1", param="n")
    if body.logprobs:
        raise APIError(
            400,
            "the agent answers with its action, not token log-probs; leave logprobs out "
            "(every call it made is in the answer's mage.calls)",
            param="logprobs",
        )
    data = dict(body.env)
    chat = body.chat()
    if not data.get("observation"):
        users = [m["content"] for m in chat if m["role"] == "user"]
        if users:
            data["observation"] = users[-1]
    game = data.get("game")
    if isinstance(game, dict) and not game.get("task_description"):
        systems = [m["content"] for m in chat if m["role"] == "system"]
        if systems:
            data["game"] = {**game, "task_description": systems[0]}
    try:
        return parse_env_message(data)
    except ValueError as error:
        raise APIError(400, str(error), param="env") from None


def completion_body(reply: AgentReply, meta: dict[str, Any]) -> dict[str, Any]:
    """The ``chat.completion`` body of an agent's answer (its calls in ``mage``)."""
    return {
        **meta,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage_of(reply),
        "mage": reply.extra(),
    }


def usage_of(reply: AgentReply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


async def stream_body(
    reply: AgentReply, meta: dict[str, Any], include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    """The answer as server-sent chunks: the role, the whole answer with ``mage``, and the
    usage if asked. The agent's answer exists only once its graph has moved, so the route
    waits for it before it starts the stream (its errors keep their HTTP status)."""

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {**meta, "object": "chat.completion.chunk", "choices": choices, **extra}

    yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}])  # fmt: skip
    yield chunk(
        [{"index": 0, "delta": {"content": reply.content}, "logprobs": None,
          "finish_reason": "stop"}],
        mage=reply.extra(),
    )  # fmt: skip
    if include_usage:
        yield chunk([], usage=usage_of(reply))
