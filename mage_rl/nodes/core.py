"""The meta-episode's nodes: ``reset_episode``, ``play``, ``env_step``, ``reflect``.

Each node is a plain async function of the state and the run context that returns only
the keys it changes. ``play`` and ``reflect`` are the two kinds of LLM call; each
appends one turn record (the training sample) to the ``turns`` channel.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.runtime import Runtime

from mage_rl.envs.base import episode_seed
from mage_rl.envs.parsing import extract_remark
from mage_rl.graphs.state import MetaEpisodeContext, MetaEpisodeState
from mage_rl.nodes.prompts import (
    Message,
    PastEpisode,
    compact_play_messages,
    play_messages,
    reflect_messages,
)
from mage_rl.records import EpisodeResult, Turn

REFLECTION_ANCHOR = "reflection"


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, values shared rather than deep-copied.

    ``dataclasses.asdict`` copies every token list of a turn on every graph step; the
    values here are fresh lists made for this turn, so sharing them is safe and cheap.
    """
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def to_langchain(messages: list[Message]) -> list[BaseMessage]:
    """Role/content dicts -> LangChain messages."""
    kinds = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}
    return [kinds[m["role"]](content=m["content"]) for m in messages]


async def call_llm(
    ctx: MetaEpisodeContext,
    messages: list[Message],
    max_tokens: int,
    stop: str,
    choices: list[str] | None = None,
) -> dict[str, Any]:
    """One LLM call; returns the fields of a turn record that the response fixes.

    ``choices`` turns on constrained decoding for this call (the chat model must accept a
    ``choices`` keyword, as :class:`~mage_rl.policy.chat_model.PolicyChatModel` does).
    """
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "stop": [stop]}
    if choices:
        kwargs["choices"] = choices
    reply = await ctx.llm.ainvoke(to_langchain(messages), **kwargs)
    text = reply.content if isinstance(reply.content, str) else str(reply.content)
    meta = getattr(reply, "response_metadata", {}) or {}
    response_ids = [int(t) for t in meta.get("response_ids", [])]
    length = len(response_ids)
    if not length:
        usage = getattr(reply, "usage_metadata", None) or {}
        length = int(usage.get("output_tokens", 0)) or len(text.split())
    return {
        "prompt_ids": [int(t) for t in meta.get("prompt_ids", [])],
        "response_ids": response_ids,
        "logprobs": [float(x) for x in meta.get("logprobs", [])],
        "text": text,
        "response_length": length,
        "max_response_length": max_tokens,
        "finish_reason": str(meta.get("finish_reason", "stop")),
        "prompt_text": messages,
        "allowed": [[int(i) for i in ids] for ids in meta.get("allowed", [])],
    }


async def reset_episode(
    state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]
) -> dict[str, Any]:
    """Start the next episode: its index is the number of episodes finished so far."""
    ctx = runtime.context
    k = len(state.get("episodes", []))
    obs = ctx.env.reset(episode_seed(ctx.task_seed, k, ctx.options.protocol))
    return {
        "episode": k,
        "step": 0,
        "observation": obs,
        "initial_observation": obs,
        "moves": [],
        "invalid_reason": "",
        "pending": None,
        "episode_done": False,
    }


async def play(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    """Ask the model for an action; the environment applies it in ``env_step``."""
    ctx = runtime.context
    opts = ctx.options
    history = [PastEpisode(**h) for h in state.get("history", [])]
    if opts.prompt == "compact":
        messages = compact_play_messages(
            brief_description=ctx.env.brief_description,
            episode=state["episode"],
            num_episodes=opts.num_episodes,
            context=opts.context,
            memory=state.get("memory", []),
            history=history,
            moves=[],
            observation=ctx.env.brief_observation or state["observation"],
            invalid_reason=state.get("invalid_reason", ""),
        )
    else:
        messages = play_messages(
            task_description=ctx.env.task_description,
            episode=state["episode"],
            num_episodes=opts.num_episodes,
            context=opts.context,
            memory=state.get("memory", []),
            history=history,
            initial_observation=state["initial_observation"],
            moves=state.get("moves", []),
            observation=state["observation"],
            invalid_reason=state.get("invalid_reason", ""),
            react=opts.react,
        )
    choices = None
    if opts.constrain_actions:
        choices = [f"<action>{a}</action>" for a in ctx.env.legal_actions()]
    fields = await call_llm(ctx, messages, opts.max_tokens, "</action>", choices)
    pending = Turn(
        kind="play",
        episode=state["episode"],
        step=state.get("step", 0),
        anchor=state["observation"],
        opponent=ctx.opponent,
        **fields,
    )
    return {"pending": _fields(pending)}


async def env_step(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    """Apply the pending response to the environment and record the finished turn."""
    ctx = runtime.context
    turn = dict(state["pending"] or {})
    result = ctx.env.step(turn["text"])
    info = result.info
    turn.update(invalid=info.invalid, invalid_reason=info.invalid_reason, reward=result.reward)
    update: dict[str, Any] = {
        "pending": None,
        "turns": [turn],
        "step": state.get("step", 0) + 1,
        "observation": result.observation,
        "invalid_reason": info.invalid_reason,
        "moves": state.get("moves", []) + info.events,
        "episode_done": result.done,
    }
    if result.done:
        k = state["episode"]
        past = [t for t in state.get("turns", []) if t["kind"] == "play" and t["episode"] == k]
        episode = EpisodeResult(
            index=k,
            outcome=info.outcome or "unfinished",
            reward=result.reward,
            payoff=info.payoff,
            turns=len(past) + 1,
            invalid_actions=sum(t["invalid"] for t in past) + int(info.invalid),
        )
        update["episodes"] = [_fields(episode)]
        update["history"] = [
            _fields(
                PastEpisode(
                    index=k,
                    initial_observation=state["initial_observation"],
                    moves=update["moves"],
                    feedback=info.feedback,
                    outcome=episode.outcome,
                    brief=ctx.env.brief_summary,
                )
            )
        ]
        last = k + 1 >= ctx.options.num_episodes
        won_and_stop = ctx.options.stop_on_success and episode.outcome == "won"
        update["meta_done"] = last or won_and_stop
    return update


async def reflect(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    """Write a reflection on the finished episode into the memory channel."""
    ctx = runtime.context
    finished = PastEpisode(**state["history"][-1])
    messages = reflect_messages(
        task_description=ctx.env.task_description,
        finished=finished,
        num_episodes=ctx.options.num_episodes,
        memory=state.get("memory", []),
    )
    fields = await call_llm(ctx, messages, ctx.options.reflect_max_tokens, "</remark>")
    remark = extract_remark(fields["text"])
    turn = Turn(
        kind="reflect",
        episode=finished.index + 1,
        step=0,
        anchor=REFLECTION_ANCHOR,
        opponent=ctx.opponent,
        invalid=remark is None,
        invalid_reason="" if remark is not None else "no <remark>...</remark> tag found",
        **fields,
    )
    update: dict[str, Any] = {"turns": [_fields(turn)]}
    if remark:
        update["memory"] = [remark]
    return update
