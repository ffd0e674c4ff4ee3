"""A real uvicorn server on a free loopback port, over the tiny model's batched engine."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from mage_rl.policy.engine import LocalEngine  # noqa: E402
from mage_rl.policy.models import load_model  # noqa: E402
from mage_rl.serve import create_app, serve_in_thread  # noqa: E402

MODEL = "tiny"
API_KEY = "test-key"


@dataclass
class Server:
    """A running server: its base URL (``.../v1``) and the engine behind it."""

    url: str
    engine: LocalEngine

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def wait_until_serving(process, root: str, log, timeout_s: float = 120) -> None:
    """Wait until the server ``process`` answers ``{root}/health``; fail with the tail of
    its ``log()`` if it exits first, or when ``timeout_s`` passes."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{root}/health").status_code == 200:
                return
        except httpx.HTTPError:
            assert process.poll() is None, log()[-2000:]
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


@pytest.fixture(scope="package")
def tiny():
    return load_model("tiny", dtype="fp32")


@pytest.fixture(scope="package")
def server(tiny) -> Iterator[Server]:
    model, tokenizer = tiny
    with (
        LocalEngine(model, tokenizer, max_batch_size=64, batch_wait_ms=10, name=MODEL) as engine,
        serve_in_thread(create_app(engine, MODEL)) as url,
    ):
        yield Server(url, engine)


@pytest.fixture(scope="package")
def keyed_server(tiny) -> Iterator[Server]:
    model, tokenizer = tiny
    with (
        LocalEngine(model, tokenizer, name=MODEL) as engine,
        serve_in_thread(create_app(engine, MODEL, api_key=API_KEY)) as url,
    ):
        yield Server(url, engine)
