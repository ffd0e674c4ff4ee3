"""A minimal fake OpenAI-compatible server (FastAPI + uvicorn on a loopback port).

It unit-tests the client side only: canned responses in vLLM's shape, injected HTTP
failures, and a record of every request body.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

PROMPT_IDS = [1, 20, 21, 22, 2, 1, 30]
RESPONSE_IDS = [40, 41, 42, 2]
LOGPROBS = [-0.5, -0.25, -1.0, -0.125]
TEXT = "<action>BET</action>"


class FakeOpenAIServer:
    """Serves ``POST /v1/chat/completions`` on ``127.0.0.1`` at a free port.

    Attributes:
        requests: JSON bodies received, in order.
        failures: HTTP status codes to answer with (one per request) before succeeding.
        with_ids: Whether to include vLLM's ``prompt_token_ids``/``token_ids``.
        finish_reason: ``finish_reason`` of the canned choice.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failures: list[int] = []
        self.with_ids = True
        self.finish_reason = "stop"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._chat)

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def reset(self) -> None:
        self.requests.clear()
        self.failures.clear()
        self.with_ids = True
        self.finish_reason = "stop"

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        if self.failures:
            code = self.failures.pop(0)
            error = {"message": f"injected failure {code}", "type": "test", "code": code}
            return JSONResponse({"error": error}, status_code=code)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": TEXT},
            "finish_reason": self.finish_reason,
            "logprobs": {
                "content": [
                    {"token": f"t{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                    for i, lp in zip(RESPONSE_IDS, LOGPROBS, strict=True)
                ]
            },
        }
        data: dict[str, Any] = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [choice],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
        }
        if self.with_ids:
            data["prompt_token_ids"] = PROMPT_IDS
            choice["token_ids"] = RESPONSE_IDS
        return JSONResponse(data)

    def start(self) -> None:
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake OpenAI server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
