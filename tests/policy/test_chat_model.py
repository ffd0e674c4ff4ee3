"""PolicyChatModel and generation_from_message."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from mage_rl.policy.base import Generation, Message, SamplingParams
from mage_rl.policy.chat_model import (
    PolicyChatModel,
    generation_from_message,
    to_policy_messages,
)

from .fake_openai import LOGPROBS, TEXT


class ScriptedPolicy:
    """Records calls and answers with a fixed generation."""

    name = "scripted"

    def __init__(self) -> None:
        self.calls: list[tuple[list[Message], SamplingParams]] = []

    async def generate(self, messages: list[Message], params: SamplingParams) -> Generation:
        self.calls.append((messages, params))
        return Generation("<action>BET</action>", [1, 2, 3], [7, 8], [-0.5, -0.25], "length")


def test_messages_convert_to_role_dicts() -> None:
    messages = [
        SystemMessage("rules"),
        HumanMessage([{"type": "text", "text": "card "}, {"type": "text", "text": "K"}]),
        AIMessage("<action>BET</action>"),
        ToolMessage("ok", tool_call_id="1"),
    ]
    assert to_policy_messages(messages) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "card K"},
        {"role": "assistant", "content": "<action>BET</action>"},
        {"role": "tool", "content": "ok"},
    ]


def test_metadata_is_plain_lists_and_round_trips() -> None:
    policy = ScriptedPolicy()
    chat = PolicyChatModel(policy=policy, temperature=0.5, stop=["</action>"])
    message = asyncio.run(chat.ainvoke([HumanMessage("go")]))
    metadata = message.response_metadata
    assert metadata["prompt_ids"] == [1, 2, 3] and metadata["response_ids"] == [7, 8]
    assert metadata["logprobs"] == [-0.5, -0.25] and metadata["finish_reason"] == "length"
    assert all(type(x) is int for x in metadata["response_ids"])
    assert all(type(x) is float for x in metadata["logprobs"])
    json.dumps(metadata)  # no tensors, nothing exotic
    assert message.usage_metadata["output_tokens"] == 2
    assert generation_from_message(message) == Generation(
        "<action>BET</action>", [1, 2, 3], [7, 8], [-0.5, -0.25], "length"
    )
    _, params = policy.calls[-1]
    assert params.temperature == 0.5 and params.stop == ("</action>",)


def test_kwargs_override_fields_for_one_call() -> None:
    policy = ScriptedPolicy()
    chat = PolicyChatModel(policy=policy, temperature=0.5, max_tokens=64)
    chat.invoke([HumanMessage("go")], temperature=0.0, top_k=4, seed=11, stop=["X"])
    _, params = policy.calls[-1]
    assert (params.temperature, params.top_k, params.seed, params.stop) == (0.0, 4, 11, ("X",))
    assert params.max_tokens == 64
    asyncio.run(chat.bind(max_tokens=8).ainvoke([HumanMessage("go")]))
    assert policy.calls[-1][1].max_tokens == 8
    with pytest.raises(ValueError, match="unknown keyword"):
        chat.invoke([HumanMessage("go")], frequency_penalty=1.0)


def test_policy_must_look_like_a_policy() -> None:
    with pytest.raises(ValueError):
        PolicyChatModel(policy=object())


def test_sync_invoke_inside_a_running_loop() -> None:
    chat = PolicyChatModel(policy=ScriptedPolicy())

    async def main() -> AIMessage:
        return chat.invoke([HumanMessage("go")])

    assert asyncio.run(main()).content == "<action>BET</action>"


def test_local_engine_through_the_adapter(engine, tiny) -> None:
    _, tokenizer = tiny
    chat = PolicyChatModel(policy=engine, max_tokens=10, seed=1)
    message = asyncio.run(
        chat.ainvoke([SystemMessage("Kuhn Poker"), HumanMessage("Your card is K.")])
    )
    generation = generation_from_message(message)
    assert generation.has_tokens
    assert tokenizer.decode(generation.response_ids, skip_special_tokens=True) == message.content
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Kuhn Poker"},
            {"role": "user", "content": "Your card is K."},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert tokenizer.decode(generation.prompt_ids) == rendered


def test_message_without_token_data_gives_empty_lists() -> None:
    generation = generation_from_message(AIMessage("hello"))
    assert generation == Generation("hello")
    assert not generation.has_tokens


def test_openai_style_logprobs_are_extracted() -> None:
    message = AIMessage(
        "hi",
        response_metadata={
            "finish_reason": "stop",
            "logprobs": {
                "content": [{"token": "h", "logprob": -0.1}, {"token": "i", "logprob": -0.2}]
            },
        },
    )
    generation = generation_from_message(message)
    assert generation.logprobs == [-0.1, -0.2] and generation.response_ids == []


def test_chat_openai_response_through_generation_from_message(fake_server) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    fake_server.reset()
    chat = langchain_openai.ChatOpenAI(
        base_url=fake_server.base_url, api_key="EMPTY", model="fake", logprobs=True, max_retries=0
    )
    message = chat.invoke([HumanMessage("go")])
    generation = generation_from_message(message)
    assert generation.text == TEXT
    assert generation.logprobs == LOGPROBS
    assert generation.finish_reason == "stop"


def test_message_survives_langgraph_checkpoint_serialisation() -> None:
    jsonplus = pytest.importorskip("langgraph.checkpoint.serde.jsonplus")
    serializer = jsonplus.JsonPlusSerializer()
    message = PolicyChatModel(policy=ScriptedPolicy()).invoke([HumanMessage("go")])
    restored = serializer.loads_typed(serializer.dumps_typed(message))
    assert generation_from_message(restored) == generation_from_message(message)
