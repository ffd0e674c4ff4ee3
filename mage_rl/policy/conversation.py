"""The conversation prompt layout: token ids as the source of truth for a growing chat.

In the conversation layout (SPEC §2, "Prompt layouts") a whole meta-episode is one chat.
Its token ids grow by appending and are never re-rendered:

1. The first call's prompt is the chat template's rendering of the first messages
   (system and user) with the generation prompt, tokenized once: exactly the prompt the
   re-rendered layout gives the same messages.
2. A sampled response is appended as the exact ids the engine sampled. It may end with
   an end-of-sequence token or in the middle of a turn (a stop string such as
   ``</action>``, or the token limit). Its span is recorded as an *assistant segment*,
   the tokens that call trains.
3. Before the next call, the template's end-of-assistant-turn text is appended,
   tokenized on its own (when the response already ends with the special token that
   text starts with, usually the EOS ``<|im_end|>``, that token is not repeated). Then
   the new messages' fragment with the generation prompt, tokenized on its own. No
   earlier token is tokenized again, so the ids can never drift from what was sampled.

The fragment text is found by rendering the template around a sentinel assistant
message: the history plus ``assistant: <sentinel>`` without a generation prompt, and the
same plus the new messages with one. What follows the sentinel in the first rendering is
the end of the assistant turn; what follows it in the second, after that end, is the
fragment. The template must be *prefix-stable* there: adding messages must not change
how the history or the end of the turn render. A template that is not fails with a
:class:`ValueError` that says so, rather than producing ids that disagree with it.

Templates that drop past reasoning (Qwen3 renders earlier assistant turns without their
``<think>`` blocks) are prefix-stable in this sense, because only the text after the
last user message changes and the conversation never re-renders it. The conversation
keeps the exact sampled ids, think blocks included: every later call sees the model's
earlier reasoning in its context (the re-rendered Qwen3 prompt would not), and the
learner trains each assistant segment, think block included, in that same context.
Sampling and training therefore agree; the context differs from the one the template
would have built.

A :class:`Conversation` is plain data (lists and dicts) so that it travels through
LangGraph state and serializes to JSON; a :class:`ConversationTemplate` holds the
tokenizer and grows conversations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from transformers import PreTrainedTokenizerBase

from mage_rl.policy.base import Message

# Text no chat template adds and no model writes; it marks where assistant content sits.
SENTINEL = "\x00mage-rl-assistant-sentinel\x00"


@dataclass(frozen=True)
class Conversation:
    """A growing chat held as token ids.

    Attributes:
        ids: Every token of the chat so far: the first prompt, each response exactly as
            sampled, each end-of-turn and message fragment as tokenized when appended.
        messages: The chat as messages (assistant messages carry the response text);
            used only to render the template around the next fragment, never to
            re-tokenize.
        segments: ``[start, end)`` spans of ``ids`` holding each sampled response, in
            call order; ``ids[:start]`` was that call's prompt.
    """

    ids: tuple[int, ...]
    messages: tuple[Message, ...]
    segments: tuple[tuple[int, int], ...] = field(default=())

    @property
    def awaiting_response(self) -> bool:
        """Whether the ids end with a generation prompt (the next thing is a response)."""
        return bool(self.messages) and self.messages[-1]["role"] != "assistant"

    @property
    def prompt_ids(self) -> list[int]:
        """The ids to send to the model for the next call."""
        if not self.awaiting_response:
            raise ValueError(
                "the conversation ends with a response; append the next messages "
                "(ConversationTemplate.append_messages) before asking for a prompt"
            )
        return list(self.ids)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (lists and dicts), e.g. for LangGraph state."""
        return {
            "ids": list(self.ids),
            "messages": [dict(m) for m in self.messages],
            "segments": [list(s) for s in self.segments],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Conversation:
        """Inverse of :meth:`to_dict`."""
        return cls(
            ids=tuple(int(i) for i in data["ids"]),
            messages=tuple(dict(m) for m in data["messages"]),
            segments=tuple((int(s), int(e)) for s, e in data.get("segments", ())),
        )


class ConversationTemplate:
    """Starts and grows :class:`Conversation` objects with one tokenizer's chat template.

    Args:
        tokenizer: A tokenizer with a ``chat_template``.
        chat_template_kwargs: Extra variables for the template (e.g.
            ``{"enable_thinking": False}`` for Qwen3); the same on every rendering.

    Raises:
        ValueError: If the tokenizer has no chat template.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; the "
                "conversation layout renders message fragments with it"
            )
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        self._special = {int(i) for i in tokenizer.all_special_ids}

    # ---- rendering -----------------------------------------------------------------

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        """The template's text for ``messages``."""
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **self.kwargs,
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` alone; the template's text already holds its special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _after_sentinel(self, text: str, what: str) -> tuple[str, str]:
        if text.count(SENTINEL) != 1:
            raise ValueError(
                f"the chat template does not render an assistant message's content verbatim "
                f"({what}); the conversation layout cannot locate the end of a response. "
                "Use the re-rendered layout with this model"
            )
        head, _, tail = text.partition(SENTINEL)
        return head, tail

    def turn_end_text(self, history: Sequence[Message]) -> str:
        """What the template writes after an assistant message's content that follows ``history``."""
        rendered = self.render([*history, _sentinel_turn()], generation_prompt=False)
        return self._after_sentinel(rendered, "end of the assistant turn")[1]

    def fragment_text(self, history: Sequence[Message], new: Sequence[Message]) -> tuple[str, str]:
        """The end-of-turn text and the new messages' text after an assistant turn.

        Args:
            history: The chat up to and including the user message the assistant answered.
            new: The messages that follow the assistant's response.

        Returns:
            ``(turn_end, fragment)``; ``fragment`` ends with the generation prompt.

        Raises:
            ValueError: If the template is not prefix-stable at this point.
        """
        without = self.render([*history, _sentinel_turn()], generation_prompt=False)
        with_new = self.render([*history, _sentinel_turn(), *new], generation_prompt=True)
        _, turn_end = self._after_sentinel(without, "history alone")
        _, tail = self._after_sentinel(with_new, "history with the new messages")
        stable_history = self.render(history, generation_prompt=False)
        if not with_new.startswith(stable_history) or not tail.startswith(turn_end):
            raise ValueError(
                "the chat template is not prefix-stable: adding a message changes how the "
                "earlier messages or the end of the assistant turn render, so appended "
                "fragments would disagree with the template. Use the re-rendered layout "
                "with this model, or a template that only appends"
            )
        return turn_end, tail[len(turn_end) :]

    # ---- growing a conversation ----------------------------------------------------

    def start(self, messages: Sequence[Message]) -> Conversation:
        """A conversation whose ids are the rendered first messages and the generation prompt.

        Raises:
            ValueError: If ``messages`` is empty or ends with an assistant message, or the
                template does not put an assistant's content right after the generation
                prompt.
        """
        if not messages:
            raise ValueError("a conversation starts from at least one message (system and user)")
        if messages[-1]["role"] == "assistant":
            raise ValueError(
                "a conversation starts from messages that await a response; the last one "
                "is an assistant message"
            )
        prompt = self.render(messages, generation_prompt=True)
        with_turn = self.render([*messages, _sentinel_turn()], generation_prompt=False)
        head, _ = self._after_sentinel(with_turn, "first messages")
        if not head.startswith(prompt):
            raise ValueError(
                "the chat template is not prefix-stable: rendering an assistant turn after "
                "the first messages does not start with their prompt and generation prompt, "
                "so sampled responses would not extend the rendered prompt. Use the "
                "re-rendered layout with this model"
            )
        return Conversation(ids=tuple(self.encode(prompt)), messages=tuple(map(dict, messages)))

    def append_response(
        self, conversation: Conversation, response_ids: Sequence[int], text: str
    ) -> Conversation:
        """Append a sampled response (exact ids) and record its segment.

        Args:
            conversation: A conversation awaiting a response.
            response_ids: The ids as sampled (possibly ending with EOS, or mid-turn at a
                stop string or the token limit).
            text: The response text (kept in ``messages`` for later renderings).

        Raises:
            ValueError: If the conversation is not awaiting a response or the response
                has no ids (a text-only backend cannot feed the conversation layout).
        """
        if not conversation.awaiting_response:
            raise ValueError(
                "the conversation already ends with a response; append the next messages "
                "before the next response"
            )
        if not response_ids:
            raise ValueError(
                "the response has no token ids; the conversation layout needs a policy "
                "backend that returns them (the local engine or vLLM)"
            )
        start = len(conversation.ids)
        ids = (*conversation.ids, *(int(i) for i in response_ids))
        return replace(
            conversation,
            ids=ids,
            messages=(*conversation.messages, {"role": "assistant", "content": text}),
            segments=(*conversation.segments, (start, len(ids))),
        )

    def message_ids(
        self, conversation: Conversation, messages: Sequence[Message]
    ) -> tuple[list[int], list[int]]:
        """The ids :meth:`append_messages` would append: end of turn, then the fragment.

        The end-of-turn ids leave out a leading special token that the response already
        ends with (an EOS ``<|im_end|>`` that the template writes too).
        """
        if conversation.awaiting_response:
            raise ValueError(
                "the conversation awaits a response; append it (append_response) before "
                "the next messages, or send all of a turn's messages at once"
            )
        if not messages:
            raise ValueError("append at least one message")
        if any(m["role"] == "assistant" for m in messages):
            raise ValueError(
                "appended messages cannot be assistant messages; responses are appended as "
                "sampled ids with append_response"
            )
        history = conversation.messages[:-1]
        turn_end_text, fragment_text = self.fragment_text(history, messages)
        turn_end = self.encode(turn_end_text)
        last = conversation.ids[-1]
        if turn_end and turn_end[0] == last and last in self._special:
            turn_end = turn_end[1:]
        return turn_end, self.encode(fragment_text)

    def append_messages(
        self, conversation: Conversation, messages: Sequence[Message]
    ) -> Conversation:
        """Close the assistant turn and append ``messages`` with the generation prompt.

        Raises:
            ValueError: If the conversation awaits a response, ``messages`` is empty or
                holds an assistant message, or the template is not prefix-stable.
        """
        turn_end, fragment = self.message_ids(conversation, messages)
        return replace(
            conversation,
            ids=(*conversation.ids, *turn_end, *fragment),
            messages=(*conversation.messages, *map(dict, messages)),
        )


def _sentinel_turn() -> Message:
    return {"role": "assistant", "content": SENTINEL}


def conversation_token_bound(
    *,
    episodes: int,
    max_turns: int,
    max_play_tokens: int,
    max_reflect_tokens: int,
    first_prompt_tokens: int,
    message_tokens: int,
    reflect_message_tokens: int,
    turn_end_tokens: int,
) -> int:
    """Most tokens a meta-episode's conversation can hold at the end of its last response.

    A meta-episode of ``episodes`` (K) episodes makes at most ``K * max_turns`` play calls
    and ``K - 1`` reflect calls (one before every episode but the first). The first call's
    prompt is rendered once; every later call adds the previous response's end of turn
    and one message fragment (generation prompt included).

    ``bound = first + P * max_play + R * max_reflect + (P + R - 1) * turn_end
    + (P - 1) * message + R * reflect_message`` with ``P = K * max_turns`` and
    ``R = K - 1``: of the ``P + R - 1`` fragments, ``R`` precede a reflect call.

    Args:
        episodes: K, episodes per meta-episode (>= 1).
        max_turns: Most play calls per episode (>= 1).
        max_play_tokens: Response limit of a play call.
        max_reflect_tokens: Response limit of a reflect call.
        first_prompt_tokens: Tokens of the first call's prompt (system, task, first
            observation, generation prompt).
        message_tokens: Most tokens of a fragment before a play call (observation or
            feedback message, its template header, the generation prompt).
        reflect_message_tokens: Most tokens of a fragment before a reflect call (the
            episode's result and the reflect request).
        turn_end_tokens: Tokens the template appends after a response (e.g. 2 for
            ChatML's ``<|im_end|>\\n``).

    Returns:
        The bound in tokens; compare it with the model's context window before
        rollouts start (:func:`check_conversation_fits`).

    Raises:
        ValueError: On a non-positive count or a negative size.
    """
    for name, value in (("episodes", episodes), ("max_turns", max_turns)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    sizes = {
        "max_play_tokens": max_play_tokens,
        "max_reflect_tokens": max_reflect_tokens,
        "first_prompt_tokens": first_prompt_tokens,
        "message_tokens": message_tokens,
        "reflect_message_tokens": reflect_message_tokens,
        "turn_end_tokens": turn_end_tokens,
    }
    for name, value in sizes.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    plays = episodes * max_turns
    reflects = episodes - 1
    return (
        first_prompt_tokens
        + plays * max_play_tokens
        + reflects * max_reflect_tokens
        + (plays + reflects - 1) * turn_end_tokens
        + (plays - 1) * message_tokens
        + reflects * reflect_message_tokens
    )


def check_conversation_fits(bound: int, context_window: int) -> None:
    """Refuse a conversation-layout config whose bound outgrows the context window.

    Args:
        bound: From :func:`conversation_token_bound`.
        context_window: The model's context length in tokens.

    Raises:
        ValueError: Naming both sizes and the ways to fix it.
    """
    if bound > context_window:
        raise ValueError(
            f"a meta-episode's conversation can reach {bound} tokens but the model's "
            f"context window is {context_window}; lower the episodes per meta-episode (K), "
            "the max turns per episode or the response token limits, use the compact "
            "prompt style, or use the re-rendered prompt layout"
        )
