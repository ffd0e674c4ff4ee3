"""The conversation layout's calls (SPEC §2, "Prompt layouts").

The whole meta-episode is one chat whose token ids are the source of truth
(:mod:`mage_rl.policy.conversation`). The chat grows like this:

1. The first call starts from the play prompt the re-rendered layout would send for the
   first step (system, then the user message with the task and first observation).
2. Every later play call first appends one user message: the new observation (with the
   reason the previous answer was invalid, if it was), or, at a new episode, the line
   that starts it (after the previous episode's outcome when no reflection told it).
3. A reflect call appends the reflect request (the finished episode's outcome and
   feedback) as a user message; the reflection is the assistant's reply.

Each reply is appended as the exact ids the engine sampled, and each call is sampled
from the conversation's ids (``prompt_ids=``), never from re-rendered text.
:meth:`~mage_rl.graphs.MetaEpisodeGraph.run` hands the final ids and one segment per call
to the record, and the learner trains the meta-episode as one sequence.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage

from mage_rl.nodes.prompts import Message, to_langchain
from mage_rl.nodes.state import MetaEpisodeContext, MetaEpisodeState
from mage_rl.policy.conversation import Conversation, ConversationTemplate

_TEMPLATES: dict[int, tuple[Any, ConversationTemplate]] = {}


def template_of(ctx: MetaEpisodeContext) -> ConversationTemplate:
    """The conversation template of the run's chat model (one per tokenizer).

    Raises:
        ValueError: The chat model has no tokenizer (a remote endpoint or another
            LangChain model); the conversation layout needs the local engine or vLLM.
    """
    tokenizer = getattr(getattr(ctx.llm, "policy", None), "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            "the conversation layout samples from token ids and needs a chat model over "
            "an engine with a tokenizer (PolicyChatModel over the local engine or "
            "vLLM); use the re-rendered layout (meta.layout: rerendered) with this model"
        )
    # Keyed by id, with the tokenizer kept beside its template: an id can be reused once
    # a tokenizer is gone, and the identity check then builds a fresh template.
    entry = _TEMPLATES.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        entry = (tokenizer, ConversationTemplate(tokenizer))
        _TEMPLATES[id(tokenizer)] = entry
    return entry[1]


def _observation(state: MetaEpisodeState, ctx: MetaEpisodeContext) -> str:
    if ctx.options.prompt == "compact":
        return ctx.env.brief_observation or state["observation"]
    return state["observation"]


def _ended(state: MetaEpisodeState, ctx: MetaEpisodeContext) -> str:
    last = state["history"][-1]
    k = int(last["index"]) + 1
    feedback = f" {last['feedback']}" if last.get("feedback") else ""
    return f"Episode {k} of {ctx.options.num_episodes} is over: {last['outcome']}.{feedback}"


def step_message(state: MetaEpisodeState, ctx: MetaEpisodeContext) -> Message:
    """The user message before a play call that is not the meta-episode's first."""
    parts = []
    if state.get("step", 0) == 0:
        # The meta-episode's very first call starts the chat instead (no history yet).
        if not ctx.options.reflects and state.get("history"):  # no reflect request told it
            parts.append(_ended(state, ctx))
        parts.append(f"Episode {state['episode'] + 1} of {ctx.options.num_episodes} starts.")
    elif state.get("invalid_reason"):
        parts.append(f"Your answer was invalid: {state['invalid_reason']}")
    parts.append(_observation(state, ctx))
    return {"role": "user", "content": "\n".join(parts)}


def reflect_message(state: MetaEpisodeState, ctx: MetaEpisodeContext) -> Message:
    """The user message that asks for a reflection between two episodes."""
    return {
        "role": "user",
        "content": f"{_ended(state, ctx)}\nDiagnose what happened and plan the next episode. "
        "Answer inside <remark></remark> tags.",
    }


async def conversation_call(
    state: MetaEpisodeState,
    ctx: MetaEpisodeContext,
    first: list[Message],
    message: Message,
    max_tokens: int,
    stop: str,
    choices: list[str] | None = None,
) -> tuple[AIMessage, dict[str, Any]]:
    """One call of the conversation layout: grow the chat, sample, append the reply.

    Args:
        state: The graph state (its ``conversation``, if any).
        ctx: The run context.
        first: The messages that start the chat when there is none yet.
        message: The user message appended before this call otherwise.
        max_tokens: Response limit.
        stop: Stop string.
        choices: Constrained decoding choices.

    Returns:
        The reply and the grown conversation (as a dict, for the state).
    """
    template = template_of(ctx)
    raw = state.get("conversation")
    if raw:
        conversation = template.append_messages(Conversation.from_dict(raw), [message])
    else:
        conversation = template.start(first)
    kwargs: dict[str, Any] = {
        "max_tokens": max_tokens,
        "stop": [stop],
        "prompt_ids": conversation.prompt_ids,
    }
    if choices:
        kwargs["choices"] = choices
    reply = await ctx.llm.ainvoke(to_langchain(list(conversation.messages)), **kwargs)
    ids = (reply.response_metadata or {}).get("response_ids") or []
    text = reply.content if isinstance(reply.content, str) else str(reply.content)
    conversation = template.append_response(conversation, ids, text)
    return reply, conversation.to_dict()
