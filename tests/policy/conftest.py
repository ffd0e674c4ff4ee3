"""Shared fixtures: the tiny model, engines over it, and a fake OpenAI server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tiny import build_tiny

from .fake_openai import FakeOpenAIServer


@pytest.fixture(scope="session")
def tiny() -> tuple[torch.nn.Module, object]:
    """The tiny fp32 model and tokenizer, shared read-only across the session."""
    return build_tiny(seed=0)


@pytest.fixture
def engine(tiny) -> Iterator[LocalEngine]:
    model, tokenizer = tiny
    with LocalEngine(model, tokenizer, max_batch_size=16, batch_wait_ms=20) as eng:
        yield eng


@pytest.fixture
def fresh_tiny() -> tuple[torch.nn.Module, object]:
    """A private tiny model, for tests that change weights or add hooks."""
    return build_tiny(seed=0)


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
