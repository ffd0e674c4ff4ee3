"""The meta-episode's nodes: ``reset_episode``, ``play``, ``env_step``, ``reflect``.

Each node is a plain async function of the state and the run context that returns only
the keys it changes. ``play`` and ``reflect`` call the run's chat model; they build no
training record: the run's tracer (:mod:`mage_rl.nodes.tracing`) records every call,
whichever node makes it. ``reset_episode`` and ``env_step`` tell the tracer where the
meta-episode is, so that each call gets its episode, step and role.
"""

from __future__ import annotations

import inspect
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.runtime import Runtime

from mage_rl.envs.base import episode_seed
from mage_rl.envs.parsing import extract_remark
from mage_rl.nodes.conversation import conversation_call, reflect_message, step_message
from mage_rl.nodes.prompts import (
    Message,
    PastEpisode,
    compact_play_messages,
    play_messages,
    reflect_messages,
    to_langchain,
)
from mage_rl.nodes.state import MetaEpisodeContext, MetaEpisodeState
from mage_rl.records import EpisodeResult, plain_fields


async def call_llm(
    ctx: MetaEpisodeContext,
    messages: list[Message] | list[BaseMessage],
    max_tokens: int,
    stop: str,
    choices: list[str] | None = None,
) -> AIMessage:
    """One call of the run's chat model (traced like any other call).

    ``choices`` turns on constrained decoding for this call (the chat model must accept a
    ``choices`` keyword, as :class:`~mage_rl.policy.chat_model.PolicyChatModel` does).
    """
    kwargs: dict[str, Any] = {"max_tokens": max_tokens, "stop": [stop]}
    if choices:
        kwargs["choices"] = choices
    if messages and isinstance(messages[0], dict):
        messages = to_langchain(messages)  # type: ignore[arg-type]
    return await ctx.llm.ainvoke(messages, **kwargs)


def message_text(message: BaseMessage) -> str:
    """The text of a chat model's reply (content blocks joined)."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        b if isinstance(b, str) else str(b.get("text", ""))
        for b in content
        if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
    )


def action_choices(ctx: MetaEpisodeContext) -> list[str]:
    """The answers constrained decoding chooses among: ``<action>A</action>`` for every
    legal action ``A`` of the current state."""
    return [f"<action>{a}</action>" for a in ctx.env.legal_actions()]


def play_prompt(state: MetaEpisodeState, ctx: MetaEpisodeContext) -> list[Message]:
    """The play prompt of the current step, as the built-in ``play`` sends it."""
    opts = ctx.options
    history = [PastEpisode(**h) for h in state.get("history", [])]
    if opts.prompt == "compact":
        return compact_play_messages(
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
    return play_messages(
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


async def reset_episode(
    state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]
) -> dict[str, Any]:
    """Start the next episode: its index is the number of episodes finished so far."""
    ctx = runtime.context
    k = len(state.get("episodes", []))
    obs = ctx.env.reset(episode_seed(ctx.task_seed, k, ctx.options.protocol))
    if inspect.isawaitable(obs):  # a game played by a client (mage_rl.envs.remote)
        obs = await obs
    ctx.tracer.start_episode(k, obs)
    return {
        "episode": k,
        "step": 0,
        "observation": obs,
        "initial_observation": obs,
        "moves": [],
        "invalid_reason": "",
        "action": "",
        "invalid_steps": 0,
        "episode_done": False,
    }


async def play(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    """Ask the model for an action; the environment applies it in ``env_step``."""
    ctx = runtime.context
    opts = ctx.options
    choices = None
    if opts.constrain_actions:
        choices = action_choices(ctx)
    if opts.layout == "conversation":
        reply, conversation = await conversation_call(
            state, ctx, play_prompt(state, ctx), step_message(state, ctx),
            opts.max_tokens, "</action>", choices,
        )  # fmt: skip
        return {"action": message_text(reply), "conversation": conversation}
    reply = await call_llm(ctx, play_prompt(state, ctx), opts.max_tokens, "</action>", choices)
    return {"action": message_text(reply)}


def past_episode(
    index: int, initial_observation: str, moves: list[str], info: Any, env: Any
) -> dict[str, Any]:
    """The ``history`` entry of a finished episode (a :class:`PastEpisode` as a dict):
    what the prompts of the later episodes show of it. ``info`` is the last step's."""
    return plain_fields(
        PastEpisode(
            index=index,
            initial_observation=initial_observation,
            moves=moves,
            feedback=info.feedback,
            outcome=info.outcome or "unfinished",
            brief=env.brief_summary,
        )
    )


async def env_step(state: MetaEpisodeState, runtime: Runtime[MetaEpisodeContext]) -> dict[str, Any]:
    """Apply the pending action to the environment; the step's acting call takes its result."""
    ctx = runtime.context
    result = ctx.env.step(state.get("action", ""))
    if inspect.isawaitable(result):
        result = await result
    info = result.info
    ctx.tracer.end_step(
        observation=result.observation,
        invalid=info.invalid,
        invalid_reason=info.invalid_reason,
        reward=result.reward,
        episode_done=result.done,
    )
    invalid_steps = state.get("invalid_steps", 0) + int(info.invalid)
    update: dict[str, Any] = {
        "action": "",
        "step": state.get("step", 0) + 1,
        "observation": result.observation,
        "invalid_reason": info.invalid_reason,
        "invalid_steps": invalid_steps,
        "moves": state.get("moves", []) + info.events,
        "episode_done": result.done,
    }
    if result.done:
        k = state["episode"]
        episode = EpisodeResult(
            index=k,
            outcome=info.outcome or "unfinished",
            reward=result.reward,
            payoff=info.payoff,
            turns=update["step"],
            invalid_actions=invalid_steps,
        )
        update["episodes"] = [plain_fields(episode)]
        update["history"] = [
            past_episode(k, state["initial_observation"], update["moves"], info, ctx.env)
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
    update: dict[str, Any] = {}
    if ctx.options.layout == "conversation":
        reply, update["conversation"] = await conversation_call(
            state, ctx, messages, reflect_message(state, ctx),
            ctx.options.reflect_max_tokens, "</remark>",
        )  # fmt: skip
    else:
        reply = await call_llm(ctx, messages, ctx.options.reflect_max_tokens, "</remark>")
    remark = extract_remark(message_text(reply))
    if remark is None:
        # A reflection without its tag is an invalid output (SPEC §3): penalised, and
        # nothing enters the memory.
        ctx.tracer.mark(reply, invalid=True, invalid_reason="no <remark>...</remark> tag found")
    elif remark:
        update["memory"] = [remark]
    return update
