"""OpenAI-compatible HTTP server for a model or a trained checkpoint (``mage serve``).

FastAPI and uvicorn come with the ``serve`` extra; this package imports them lazily.

Example:
    >>> from mage_rl.serve import create_app, serve_in_thread
    >>> with LocalEngine(model, tokenizer) as engine:
    ...     with serve_in_thread(create_app(engine, "tiny")) as base_url:
    ...         openai.OpenAI(base_url=base_url, api_key="x").models.list()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mage_rl.serve.launch import (
    free_port,
    serve_in_thread,
    serve_local,
    serve_vllm,
    vllm_available,
    vllm_command,
)

if TYPE_CHECKING:
    from mage_rl.policy.models import resolve_model
    from mage_rl.serve.app import create_app

__all__ = [
    "create_app",
    "free_port",
    "resolve_model",
    "serve_in_thread",
    "serve_local",
    "serve_vllm",
    "vllm_available",
    "vllm_command",
]


def __getattr__(name: str) -> Any:
    if name == "create_app":  # needs fastapi (the serve extra)
        from mage_rl.serve.app import create_app

        return create_app
    if name == "resolve_model":  # loads torch and transformers
        from mage_rl.policy.models import resolve_model

        return resolve_model
    raise AttributeError(name)
