"""The in-process tiny model and tokenizer."""

from __future__ import annotations

import time

import torch

from mage_rl.policy.tiny import build_tiny


def test_build_is_fast_deterministic_and_small(tiny) -> None:
    start = time.perf_counter()
    model, tokenizer = build_tiny(seed=0)
    assert time.perf_counter() - start < 2.0
    reference, reference_tokenizer = tiny
    assert tokenizer.get_vocab() == reference_tokenizer.get_vocab()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    other, _ = build_tiny(seed=1)
    assert not torch.equal(other.lm_head.weight, model.lm_head.weight)
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 <= n_params <= 1_000_000
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.dtype == torch.float32


def test_build_leaves_global_rng_alone() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_tiny(seed=3)
    assert torch.equal(torch.rand(3), expected)


def test_tokenizer_has_chatml_and_special_tokens(tiny) -> None:
    _, tokenizer = tiny
    assert 500 <= len(tokenizer) <= 2048
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tokenizer(special, add_special_tokens=False)["input_ids"]) == 1
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Your card is K."}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nYour card is K.<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_round_trips_game_text_and_any_bytes(tiny) -> None:
    _, tokenizer = tiny
    for text in (
        "<action>BET</action> <remark>The opponent always bets with a King.</remark>",
        "PASS BET 0123456789 Sokoban: push the box",
        "unicode é 漢字 🙂 and tabs\t",
    ):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    # The corpus makes the game vocabulary compact.
    assert len(tokenizer("<action>PASS</action>", add_special_tokens=False)["input_ids"]) <= 7
