"""A LangChain chat model over any :class:`~mage_rl.policy.base.Policy`.

LangGraph nodes call LangChain chat models; training needs token ids and log-probs. The
adapter carries them through the message itself: the returned ``AIMessage`` holds, in
``response_metadata``,

* ``prompt_ids``: ``list[int]``,
* ``response_ids``: ``list[int]``,
* ``logprobs``: ``list[float]``,
* ``finish_reason``: ``"stop"`` or ``"length"``,
* ``allowed``: ``list[list[int]]``, the allowed ids per response token when the call
  passed ``choices=[...]`` (constrained decoding), else empty,
* ``model_name``: the policy's name,

as plain Python lists, never tensors: LangGraph's checkpointer serialises messages and
cannot take tensors. :func:`generation_from_message` reads them back, and also reads what
it can from other chat models (``ChatOpenAI`` with ``logprobs=True`` gives log-probs but
no ids).
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr

from mage_rl.policy.asyncutil import run_sync
from mage_rl.policy.base import Generation, Message, Policy, SamplingParams

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "stop", "seed", "explore")


class PolicyChatModel(BaseChatModel):
    """LangChain chat model that samples from a :class:`Policy` and keeps token data.

    The sampling fields are defaults; ``temperature``, ``top_p``, ``top_k``,
    ``max_tokens``, ``stop`` and ``seed`` passed to ``invoke``/``ainvoke`` (or bound with
    ``.bind``) override them for one call. ``choices=[...]`` turns on constrained decoding
    for one call (see :class:`~mage_rl.policy.base.SamplingParams`); ``prompt_ids=[...]``
    samples from those exact ids instead of rendering the messages (a policy with
    ``generate_from_ids``, such as the local engine).

    Example:
        >>> chat = PolicyChatModel(policy=engine, temperature=0.7, stop=["</action>"])
        >>> msg = await chat.ainvoke([HumanMessage("Your card is K.")])
        >>> msg.response_metadata["logprobs"][:3]
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: Policy = Field(description="The Policy to sample from (LocalEngine, OpenAIPolicy).")
    temperature: float = Field(default=1.0, description="Softmax temperature; 0 is greedy.")
    top_p: float = Field(default=1.0, description="Nucleus truncation; 1 keeps everything.")
    top_k: int = Field(default=0, description="Top-k truncation; 0 keeps everything.")
    max_tokens: int = Field(default=256, description="Most tokens in a response.")
    stop: list[str] | None = Field(default=None, description="Stop strings, kept in the text.")
    seed: int | None = Field(default=None, description="Sampler seed; None draws one.")
    explore: float = Field(
        default=0.0, description="Uniform share mixed into constrained choices (training)."
    )

    @property
    def _llm_type(self) -> str:
        return "mage-policy"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"policy": getattr(self.policy, "name", type(self.policy).__name__)} | {
            key: getattr(self, key) for key in _SAMPLING_KEYS
        }

    def sampling_params(self, stop: list[str] | None = None, **overrides: Any) -> SamplingParams:
        """The :class:`SamplingParams` of one call: fields, then ``stop``, then overrides.

        Raises:
            ValueError: On an unknown keyword or an invalid value.
        """
        choices = tuple(overrides.pop("choices", None) or ())
        unknown = set(overrides) - set(_SAMPLING_KEYS)
        if unknown:
            raise ValueError(
                f"PolicyChatModel got unknown keyword(s) {sorted(unknown)}; "
                f"accepted: {list(_SAMPLING_KEYS)}"
            )
        values = {key: getattr(self, key) for key in _SAMPLING_KEYS}
        if stop is not None:
            values["stop"] = stop
        values.update(overrides)
        stops = values.pop("stop") or ()
        return SamplingParams(
            stop=(stops,) if isinstance(stops, str) else tuple(stops), choices=choices, **values
        )

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        prompt_ids = kwargs.pop("prompt_ids", None)
        params = self.sampling_params(stop, **kwargs)
        if prompt_ids is not None:
            # Token-in: the caller holds the prompt as ids (the conversation layout); the
            # messages are only what the ids say, for tracing.
            from_ids = getattr(self.policy, "generate_from_ids", None)
            if from_ids is None:
                raise ValueError(
                    f"{type(self.policy).__name__} cannot sample from prompt ids; the "
                    "conversation layout needs the local engine or vLLM"
                )
            generation = await from_ids([int(i) for i in prompt_ids], params)
        else:
            generation = await self.policy.generate(to_policy_messages(messages), params)
        return _chat_result(generation, getattr(self.policy, "name", ""))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # Policies are async-only; run_sync uses a fresh loop (on a helper thread if this
        # thread already runs one).
        return run_sync(self._agenerate(messages, stop, None, **kwargs))


class SeededChatModel(PolicyChatModel):
    """A :class:`PolicyChatModel` whose i-th call samples with seed
    ``derive_seed("eval-call", sample_seed, i)``.

    One instance per meta-episode makes its samples a function of ``sample_seed`` alone,
    whatever the batching, the scheduling or the order in which concurrent meta-episodes
    reach the engine. A call that passes its own ``seed`` keeps it.
    """

    sample_seed: int = 0
    _calls: int = PrivateAttr(default=0)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if kwargs.get("seed") is None:
            from mage_rl.envs.base import derive_seed  # not at import: envs loads OpenSpiel

            kwargs["seed"] = derive_seed("eval-call", self.sample_seed, self._calls)
            self._calls += 1
        return await super()._agenerate(messages, stop, run_manager, **kwargs)


def seeded(chat: PolicyChatModel, sample_seed: int) -> SeededChatModel:
    """A :class:`SeededChatModel` with the policy and sampling settings of ``chat``."""
    fields = {name: getattr(chat, name) for name in PolicyChatModel.model_fields}
    return SeededChatModel(**fields, sample_seed=sample_seed)


def to_policy_messages(messages: list[BaseMessage]) -> list[Message]:
    """Convert LangChain messages into ``{"role", "content"}`` dicts.

    System, human, AI and tool messages map to ``system``, ``user``, ``assistant`` and
    ``tool``; a ``ChatMessage`` keeps its role. List content (content blocks) is reduced to
    its text parts, joined.

    Raises:
        TypeError: On a message type with no chat role.
    """
    converted: list[Message] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            role = "system"
        elif isinstance(message, HumanMessage):
            role = "user"
        elif isinstance(message, AIMessage):
            role = "assistant"
        elif isinstance(message, ToolMessage):
            role = "tool"
        elif isinstance(message, ChatMessage):
            role = message.role
        else:
            raise TypeError(f"cannot send a {type(message).__name__} to a chat policy")
        converted.append({"role": role, "content": _text(message.content)})
    return converted


def generation_from_message(message: BaseMessage) -> Generation:
    """Read a :class:`Generation` back from a chat model's message.

    Works for :class:`PolicyChatModel` messages (everything is there) and for other chat
    models: ids missing from the metadata become empty lists, and log-probs in OpenAI's
    format (``{"content": [{"token", "logprob", ...}]}``, as ``ChatOpenAI`` with
    ``logprobs=True`` stores them) are extracted.

    Args:
        message: Usually an ``AIMessage``.

    Returns:
        The generation; check ``has_tokens`` before training on it.
    """
    metadata = message.response_metadata or {}
    return Generation(
        text=_text(message.content),
        prompt_ids=_int_list(metadata.get("prompt_ids") or metadata.get("prompt_token_ids")),
        response_ids=_int_list(metadata.get("response_ids") or metadata.get("token_ids")),
        logprobs=_logprob_list(metadata.get("logprobs")),
        finish_reason="length" if metadata.get("finish_reason") == "length" else "stop",
        allowed=[_int_list(ids) for ids in metadata.get("allowed") or []],
    )


def _chat_result(generation: Generation, model_name: str) -> ChatResult:
    metadata = {
        "prompt_ids": [int(i) for i in generation.prompt_ids],
        "response_ids": [int(i) for i in generation.response_ids],
        "logprobs": [float(x) for x in generation.logprobs],
        "finish_reason": generation.finish_reason,
        "model_name": model_name,
        "allowed": [[int(i) for i in ids] for ids in generation.allowed],
    }
    usage = None
    if generation.response_ids:
        prompt, response = len(generation.prompt_ids), len(generation.response_ids)
        usage = {
            "input_tokens": prompt,
            "output_tokens": response,
            "total_tokens": prompt + response,
        }
    message = AIMessage(content=generation.text, response_metadata=metadata, usage_metadata=usage)
    return ChatResult(generations=[ChatGeneration(message=message)])


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "".join(parts)


def _int_list(value: object) -> list[int]:
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return []


def _logprob_list(value: object) -> list[float]:
    if isinstance(value, dict):  # OpenAI format: {"content": [{"token", "logprob"}, ...]}
        value = value.get("content") or []
    if not isinstance(value, (list, tuple)):
        return []
    out: list[float] = []
    for item in value:
        if isinstance(item, dict):
            if item.get("logprob") is None:
                return []  # a gap would misalign log-probs with tokens
            out.append(float(item["logprob"]))
        else:
            out.append(float(item))
    return out
