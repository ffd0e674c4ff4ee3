"""The agent's requests and answers on the wire (:mod:`mage_rl.serve.agent` plays them):
the environment message a chat request carries, and the ``chat.completion`` (or stream)
that carries the agent's move, its calls and its reflections in ``mage``."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mage_rl.envs.parsing import extract_remark
from mage_rl.envs.remote import EnvMessage, parse_env_message
from mage_rl.nodes.tracing import Tracer
from mage_rl.policy.base import RequestRejected
from mage_rl.policy.engine import EngineClosedError
from mage_rl.serve.protocol import APIError

logger = logging.getLogger(__name__)


@dataclass
class AgentReply:
    """What one request gets back (see the module docstring)."""

    content: str
    episode: int
    episode_done: bool
    meta_done: bool
    calls: list[dict[str, Any]]
    reflections: list[str]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    session: str = ""
    seq: int = 0

    def extra(self) -> dict[str, Any]:
        """The ``mage`` field of the response body."""
        return {
            "session": self.session,
            "seq": self.seq,
            "episode": self.episode,
            "episode_done": self.episode_done,
            "meta_done": self.meta_done,
            "calls": self.calls,
            "reflections": self.reflections,
        }


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


def memory_of(tracer: Tracer) -> list[str]:
    """The reflections written so far (the reflect calls' remarks)."""
    out = []
    for turn in tracer.turns:
        if turn.kind == "reflect" and not turn.invalid:
            remark = extract_remark(turn.text)
            if remark:
                out.append(remark)
    return out


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


def fingerprint(message: EnvMessage) -> tuple[str, Any]:
    """The message's digest and its JSON form, for the log (on a worker thread)."""
    text = message.model_dump_json()
    return hashlib.sha256(text.encode()).hexdigest(), message.model_dump(mode="json")


def api_error(error: Exception, agent: str) -> APIError:
    """How a failed message is answered: the client's input, the server, or the agent."""
    if isinstance(error, RequestRejected):
        return APIError(400, f"the agent cannot take this message: {error}", param="env",
                        code="context_length_exceeded" if "context" in str(error) else None)  # fmt: skip
    if isinstance(error, EngineClosedError):
        return APIError(503, f"the server is shutting down ({error})", "server_error")
    if isinstance(error, OSError):
        logger.error("agent %s: cannot log a session", agent, exc_info=error)
        return APIError(503, f"the server cannot store the session ({error})", "server_error")
    logger.error("agent %s: the graph failed", agent, exc_info=error)
    return APIError(500, f"the agent's graph failed: {error}", "server_error")
