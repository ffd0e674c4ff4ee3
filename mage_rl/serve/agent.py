"""A trained agent behind the OpenAI API: one session per client game (``mage serve RUN --agent``).

The server runs the agent's own graph, the one its run trained (built-in or a plugin's,
with its prompts, layout, constrained decoding, token limits and reflections), every call
of it answered by the served weights. A *session* is one meta-episode of one client. Its
first request (a start message with ``game``) opens it, and the answer gives its
*handle* (:mod:`mage_rl.serve.handles`), which every later request sends in ``session``.
The graph plays against a :class:`~mage_rl.envs.remote.RemoteEnv`, so each request hands
the client's environment message to the waiting graph and returns what it does next:

* the agent's response, when it acts (the assistant message the client's game applies);
* an empty answer with ``episode_done``, when an episode's end has been taken in (and the
  reflection written, if the agent writes one); the client then sends the next start;
* an empty answer with ``meta_done``, when the meta-episode is over (K episodes, or a win
  under the run's stop rule).

What a session survives (:mod:`mage_rl.serve.store`, :mod:`mage_rl.serve.replay`): every
answered message is logged, with the model's answers, before the client gets its answer.
A message that fails (a 400 found deep in the graph, a 500 of the agent's own code, a
client that hangs up) leaves the session as it was before it: the next request restores
the session from its log, so a retry of the same message is played again. A restarted
server restores its sessions the same way. Each answer carries ``seq``, the message's
place in the session; a request that sends ``seq`` and repeats the last answered message
gets that answer again (the reply a crash or a dropped connection lost).

Sessions are isolated (each has its graph state, memory, chat model and sampling seed),
at most ``max_sessions`` open at once, one request each at a time, and a session left
idle for ``idle_s`` seconds is closed (410 afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mage_rl.envs.remote import AgentAction, EnvMessage, GameTexts, RemoteEnv
from mage_rl.graphs import MetaEpisodeGraph
from mage_rl.nodes.tracing import Tracer
from mage_rl.serve.agent_api import AgentReply, api_error, call_view, fingerprint, memory_of
from mage_rl.serve.handles import handle_key, new_handle, owner_of, same_owner
from mage_rl.serve.protocol import APIError
from mage_rl.serve.replay import RecordingPolicy, ReplayDiverged
from mage_rl.serve.store import SessionStore

logger = logging.getLogger(__name__)

DEFAULT_MAX_SESSIONS = 256
DEFAULT_IDLE_S = 600.0
MAX_TURNS_CAP = 1_000
LOG_VERSION = 1


@dataclass
class Live:
    """A session's graph while it runs in this process."""

    env: RemoteEnv
    tracer: Tracer
    task: asyncio.Task[Any]
    recorder: RecordingPolicy
    sent: int = 0


@dataclass
class Session:
    """One client's meta-episode: who opened it, how far it got, its graph if running."""

    key: str
    owner: str
    user: str
    sampling: dict[str, Any]
    last_used: float
    answered: int = 0
    last: tuple[str, AgentReply] | None = None  # the last answered message's digest, answer
    finished: bool = False
    live: Live | None = None
    busy: bool = False


class AgentSessions:
    """The sessions of one served agent.

    Args:
        graph: The agent's meta-episode graph.
        chat_for: Makes a session's chat model (a
            :class:`~mage_rl.policy.chat_model.PolicyChatModel`) from its sampling
            settings (``temperature``, ``top_p``, ``top_k``, ``seed``; ``None`` where the
            request gives none).
        name: The agent's model name.
        max_sessions: Most sessions open at once; one more is refused (429).
        idle_s: Seconds a session may wait for its client before it is closed.
        state_dir: Where the sessions' logs are kept, so that a restarted server resumes
            them (``None``: in memory, for this process only).
        identity: What must match for a logged session to be resumed: the agent, its
            checkpoint (default: ``name``).
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
        state_dir: Path | None = None,
        identity: str | None = None,
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
        self.identity = identity or name
        self.clock = clock
        self.store = SessionStore(state_dir)
        self._sessions: dict[str, Session] = {}
        self._closed: OrderedDict[str, tuple[str, APIError]] = OrderedDict()
        self._adopt()

    @property
    def episodes(self) -> int:
        return self.graph.options.num_episodes

    def __len__(self) -> int:
        """Sessions open (a finished session waits only for a retry of its last answer)."""
        return sum(not s.finished for s in self._sessions.values())

    def owner(self, api_key: str | None) -> str:
        """The owner of sessions opened with ``api_key`` (see :mod:`.handles`)."""
        return owner_of(api_key, self.store.secret)

    # -- requests ----------------------------------------------------------------------

    async def turn(
        self,
        handle: str | None,
        message: EnvMessage,
        sampling: dict[str, Any],
        *,
        seq: int | None = None,
        owner: str = "",
        user: str = "",
    ) -> AgentReply:
        """Hand ``message`` to the session ``handle`` (a new one when ``None``) and wait
        for the agent's next move.

        Raises:
            APIError: 400 for a message the session does not wait for or cannot take,
                404 for a handle that finds no session (unknown, or another owner's),
                409 while the session has a request in flight, 410 for a session that
                expired or cannot be restored, 429 at the session limit, 500 when the
                agent's own code fails, 503 when the engine or the disk fails.
        """
        self.expire_idle()
        digest, dumped = await asyncio.to_thread(fingerprint, message)
        if handle is None:
            handle = new_handle()
            session = await self._open(handle, message, sampling, owner, user)
        else:
            session = self._find(handle_key(handle), owner)
            if session.busy:
                raise APIError(
                    409,
                    "this session has a request in flight; send its next message when the "
                    "agent has answered",
                    param="session",
                    code="session_busy",
                )
            session.busy = True
        try:
            reply = await self._take(session, message, digest, dumped, seq)
        finally:
            session.busy = False
            session.last_used = self.clock()
        return dataclasses.replace(reply, session=handle)

    async def _open(
        self, handle: str, message: EnvMessage, sampling: dict[str, Any], owner: str, user: str
    ) -> Session:
        """A new session, already marked busy with its first request."""
        if message.kind != "start" or message.game is None:
            raise APIError(
                400,
                "a session starts with a start message that carries game (env.kind 'start', "
                "env.game); every later message sends the handle of the session's first "
                "answer (its mage.session) in the 'session' field",
                param="session",
            )
        if len(self) >= self.max_sessions:
            raise APIError(
                429,
                f"the agent has {len(self)} sessions open, its limit; finish or abandon "
                f"one (sessions close after {self.idle_s:g} s idle)",
                param="session",
                code="too_many_sessions",
            )
        if message.game.max_turns > MAX_TURNS_CAP:
            raise APIError(400, f"env.game.max_turns is at most {MAX_TURNS_CAP}", param="env")
        key = handle_key(handle)
        assert key is not None
        # Counted (and busy) from now on, so that requests opening sessions meanwhile
        # see it against the limit.
        session = Session(key, owner, user, dict(sampling), self.clock(), busy=True)
        self._sessions[key] = session
        header = {"version": LOG_VERSION, "agent": self.identity, "owner": owner,
                  "user": user, "sampling": session.sampling}  # fmt: skip
        try:
            await asyncio.to_thread(self.store.create, key, header)
            session.live = self._launch(session, message.game, ())
        except BaseException as error:
            self._forget(session)
            if isinstance(error, OSError):
                raise api_error(error, self.name) from error
            raise
        logger.info("agent %s: session %r opened (%d open)", self.name, user, len(self))
        return session

    def _find(self, key: str | None, owner: str) -> Session:
        session = self._sessions.get(key) if key else None
        if session is not None and same_owner(session.owner, owner):
            return session
        closed = self._closed.get(key) if key else None
        if closed is not None and same_owner(closed[0], owner):
            raise closed[1]
        raise APIError(
            404,
            "there is no session with this handle; send the handle the session's first "
            "answer gave (mage.session), with the API key that opened it. A session "
            "starts with a start message that carries game and no 'session'",
            param="session",
            code="session_not_found",
        )

    async def _take(
        self, session: Session, message: EnvMessage, digest: str, dumped: Any, seq: int | None
    ) -> AgentReply:
        if session.live is None and (session.last is None or not session.finished):
            await self._restore(session)
        if self._is_retry(session, message, digest, seq):
            assert session.last is not None
            return session.last[1]
        if seq is not None and seq != session.answered:
            raise APIError(
                400,
                f"this session has answered {session.answered} messages, so its next "
                f"message is seq {session.answered}, not {seq}",
                param="seq",
            )
        if session.finished:
            raise APIError(400, "this session's meta-episode is over; start a new session",
                           param="session")  # fmt: skip
        live = session.live
        assert live is not None
        self._check_order(live.env, message, first=session.answered == 0)
        try:
            reply = await self._exchange(session, message, session.answered)
            entry = {"seq": session.answered, "digest": digest, "message": dumped,
                     "calls": live.recorder.take()}  # fmt: skip
            # Shielded: once written, the line stands, whatever happens to the request.
            await asyncio.shield(asyncio.to_thread(self.store.append, session.key, entry))
        except BaseException as error:
            self._drop(session)  # the next request restores the session from its log
            if session.answered == 0:
                self._forget(session)  # nothing answered: nothing to keep
            if isinstance(error, Exception) and not isinstance(error, APIError):
                raise api_error(error, self.name) from error
            raise
        session.answered += 1
        session.last = (digest, reply)
        if reply.meta_done:
            session.finished = True
            session.live = None
        return reply

    def _is_retry(
        self, session: Session, message: EnvMessage, digest: str, seq: int | None
    ) -> bool:
        """Whether ``message`` repeats the last answered one (a client's retry)."""
        if session.last is None or session.last[0] != digest:
            return False
        if seq is not None:
            return seq == session.last[1].seq
        # Without seq, only a repeat that could not be a new message is taken as a retry.
        expecting = session.live.env.expecting if session.live else None
        return session.finished or message.kind != expecting

    def _check_order(self, env: RemoteEnv, message: EnvMessage, *, first: bool) -> None:
        if message.kind != env.expecting:
            after = "its action" if env.expecting == "result" else "the end of an episode"
            raise APIError(
                400,
                f"the session waits for a {env.expecting} message after {after}, got a "
                f"{message.kind} message",
                param="env",
            )
        if message.game is not None and not first:
            raise APIError(400, "game is sent once, with a session's first message", param="env")
        result = message.result
        if result is not None and not result.done and env.turns + 1 >= env.max_turns:
            raise APIError(
                400,
                f"the episode has reached the game's max_turns ({env.max_turns}); this "
                "result must end it (done true)",
                param="env",
            )

    # -- the graph -----------------------------------------------------------------------

    def _launch(self, session: Session, game: GameTexts, script: Any) -> Live:
        env = RemoteEnv(game)
        tracer = Tracer("client")
        chat = self.chat_for(**session.sampling)
        if getattr(chat, "policy", None) is None:
            raise TypeError(
                f"the agent's chat model must be a PolicyChatModel (over the engine), got "
                f"{type(chat).__name__}: its calls are logged so that sessions can resume"
            )
        recorder = RecordingPolicy(chat.policy, script)
        llm = chat.model_copy(update={"policy": recorder})
        seed = session.sampling.get("seed")
        run = self.graph.run(env, llm, task_seed=0 if seed is None else int(seed),
                             opponent="client", tracer=tracer)  # fmt: skip
        return Live(env, tracer, asyncio.ensure_future(run), recorder)

    async def _exchange(self, session: Session, message: EnvMessage, seq: int) -> AgentReply:
        live = session.live
        assert live is not None
        await live.env.inbox.put(message)
        out = asyncio.ensure_future(live.env.outbox.get())
        try:
            await asyncio.wait({out, live.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not out.done():
                out.cancel()
        if out.done() and not out.cancelled():
            event = out.result()
            if isinstance(event, AgentAction):
                return self._reply(live, event.text, seq, episode_done=False, meta_done=False)
            return self._reply(live, "", seq, episode_done=True, meta_done=False)
        error = live.task.exception()
        if error is not None:
            raise error
        return self._reply(live, "", seq, episode_done=True, meta_done=True)

    async def _restore(self, session: Session) -> None:
        """Run the session's graph again over its log (:mod:`mage_rl.serve.replay`)."""
        loaded = await asyncio.to_thread(self.store.load, session.key)
        if loaded is None or not loaded[1]:
            self._forget(session)
            raise self._gone(session, "its log is gone")
        header, entries = loaded
        if header.get("agent") != self.identity:
            self._forget(session)
            raise self._gone(
                session,
                f"it was played by {header.get('agent')!r} and this server serves "
                f"{self.identity!r}",
            )
        first = EnvMessage.model_validate(entries[0]["message"])
        assert first.game is not None
        script = [call for entry in entries for call in entry["calls"]]
        session.live = self._launch(session, first.game, script)
        try:
            for entry in entries:
                message = EnvMessage.model_validate(entry["message"])
                reply = await self._exchange(session, message, int(entry["seq"]))
            if session.live.recorder.replaying:
                raise ReplayDiverged("the graph ended before it had made every logged call")
        except asyncio.CancelledError:
            self._drop(session)
            raise
        except Exception as error:
            self._drop(session)
            self._forget(session)
            logger.warning("agent %s: session %r cannot be restored", self.name, session.user,
                           exc_info=error)  # fmt: skip
            raise self._gone(session, f"replaying its log failed ({error})") from None
        session.answered = len(entries)
        session.last = (entries[-1]["digest"], reply)
        session.finished = reply.meta_done
        logger.info("agent %s: session %r restored at message %d", self.name, session.user,
                    session.answered)  # fmt: skip

    def _reply(
        self, live: Live, content: str, seq: int, *, episode_done: bool, meta_done: bool
    ) -> AgentReply:
        turns = live.tracer.turns
        new = turns[live.sent :]
        acting = None if episode_done or meta_done else live.tracer.pending_acting()
        live.sent = len(turns)
        done_episodes = live.tracer.episode
        episode = done_episodes - 1 if episode_done or meta_done else done_episodes
        state = live.task.result() if meta_done else None
        memory = list(state.get("memory", [])) if state else memory_of(live.tracer)
        return AgentReply(
            content=content,
            episode=max(episode, 0),
            episode_done=episode_done,
            meta_done=meta_done,
            calls=[call_view(t, t is acting) for t in new],
            reflections=memory,
            prompt_tokens=sum(len(t.prompt_ids) for t in new),
            completion_tokens=sum(len(t.response_ids) for t in new),
            seq=seq,
        )

    # -- housekeeping ------------------------------------------------------------------

    def _adopt(self) -> None:
        """Take in the sessions a previous server left in the state directory."""
        now, wall = self.clock(), time.time()
        for key, changed in self.store.logs():
            header = self.store.header(key)
            if header is None or wall - changed > self.idle_s:
                self.store.remove(key)
                continue
            self._sessions[key] = Session(
                key, str(header.get("owner", "")), str(header.get("user", "")),
                dict(header.get("sampling") or {}), now - (wall - changed),
            )  # fmt: skip
        if self._sessions:
            logger.info("agent %s: %d sessions to resume", self.name, len(self._sessions))

    def expire_idle(self) -> None:
        """Close every session idle for longer than ``idle_s``."""
        now = self.clock()
        for session in list(self._sessions.values()):
            if not session.busy and now - session.last_used > self.idle_s:
                self._drop(session)
                self._forget(session)
                error = APIError(
                    410,
                    f"this session expired after {self.idle_s:g} s without a request; start "
                    "a new one with a start message that carries game",
                    param="session",
                    code="session_expired",
                )
                self._remember(session, error)
                logger.info("agent %s: session %r expired", self.name, session.user)

    def _gone(self, session: Session, reason: str) -> APIError:
        error = APIError(410, f"this session cannot be resumed: {reason}; start a new one",
                         param="session", code="session_gone")  # fmt: skip
        self._remember(session, error)
        return error

    def _remember(self, session: Session, error: APIError) -> None:
        self._closed[session.key] = (session.owner, error)
        while len(self._closed) > 16 * self.max_sessions:
            self._closed.popitem(last=False)

    def _drop(self, session: Session) -> None:
        """Stop the session's graph; its log stays (the session is restored from it)."""
        live, session.live = session.live, None
        if live is not None and not live.task.done():
            live.task.cancel()
        elif live is not None and not live.task.cancelled():
            live.task.exception()  # retrieved: its error was answered or is moot

    def _forget(self, session: Session) -> None:
        self._sessions.pop(session.key, None)
        self.store.remove(session.key)

    async def aclose(self) -> None:
        """Stop every session's graph (their logs stay for the next server)."""
        tasks = [s.live.task for s in self._sessions.values() if s.live is not None]
        for session in self._sessions.values():
            self._drop(session)
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
