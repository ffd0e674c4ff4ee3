"""Start the server: resolve what to serve, then run uvicorn (or ``vllm serve``).

``MODEL_OR_CHECKPOINT`` may be

* a model spec of :func:`~mage_rl.policy.models.load_model` (``tiny``, ``smollm2``, an HF
  directory or a ``.gguf`` file);
* a checkpoint of ``mage train``, ``runs/NAME/checkpoints/iter_N`` (its ``model/`` is
  served);
* a run folder, ``runs/NAME`` (its newest complete checkpoint is served).

The served model name (what clients put in ``model``) is the argument as given, as with
``vllm serve``, unless ``--served-model-name`` says otherwise.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

VLLM_HINT = (
    "--engine vllm needs vLLM on a machine with a supported GPU: pip install vllm "
    "(or the cluster extra: pip install 'mage-rl[cluster]'); on CPU use --engine local"
)
SERVE_HINT = "mage serve needs the serve extra: pip install 'mage-rl[serve]'"


def resolve_model(spec: str) -> str:
    """The model spec or HF directory that ``spec`` names (see the module docstring).

    Raises:
        FileNotFoundError: For a run folder without a complete checkpoint, or a LoRA
            checkpoint written before merged models were saved.
    """
    if spec in ("tiny", "smollm2"):
        return spec
    path = Path(spec).expanduser()
    if (path / "checkpoints").is_dir():
        from mage_rl.rl.trainer import latest_checkpoint

        checkpoint = latest_checkpoint(path)
        if checkpoint is None:
            raise FileNotFoundError(f"run folder {path} has no complete checkpoint yet")
        path = checkpoint
    if (path / "model").is_dir() and not (path / "config.json").exists():
        path = path / "model"
    if (path / "adapter_config.json").exists() and not (path / "config.json").exists():
        raise FileNotFoundError(
            f"{path} holds LoRA adapters only (written by an older mage train); resume the "
            "run for one iteration (mage train CONFIG --resume) to write a merged, servable model"
        )
    return str(path)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _require_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"{SERVE_HINT} ({error})") from error


@contextmanager
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int | None = None, timeout: float = 30.0
) -> Iterator[str]:
    """Run ``app`` on a real uvicorn server in a background thread.

    Yields:
        The API base URL, ``http://HOST:PORT/v1``, once the server accepts connections.
        Leaving the block shuts the server down.
    """
    _require_serve_extra()
    import uvicorn

    port = port or free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout)


def serve_local(
    spec: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    dtype: str = "auto",
    max_batch_size: int = 32,
    batch_wait_ms: float = 5.0,
    default_max_tokens: int | None = None,
    seed: int = 0,
) -> None:
    """Serve ``spec`` with the local batched engine until interrupted (``mage serve``)."""
    _require_serve_extra()
    import uvicorn

    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model
    from mage_rl.serve.app import create_app

    path = resolve_model(spec)
    model, tokenizer = load_model(path, dtype=dtype)  # type: ignore[arg-type]
    name = served_model_name or spec
    with LocalEngine(
        model, tokenizer, max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
        seed=seed, name=name,
    ) as engine:  # fmt: skip
        app = create_app(engine, name, api_key=api_key, default_max_tokens=default_max_tokens)
        _warn_if_exposed(host, api_key)
        logger.info("serving %s (%s) as %r on http://%s:%d/v1", spec, path, name, host, port)
        uvicorn.run(app, host=host, port=port, log_level="info")


def vllm_command(
    model_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The ``vllm serve`` command line for a checkpoint.

    ``--logprobs-mode processed_logprobs`` (vLLM >= 0.10.2) makes vLLM report the
    log-probs of the distribution it sampled from, the convention of the local engine and
    of the learner; without it, rollouts through vLLM would record raw log-probs.
    """
    cmd = [
        _vllm_executable(), "serve", model_dir, "--host", host, "--port", str(port),
        "--served-model-name", served_model_name or model_dir,
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    if api_key:
        cmd += ["--api-key", api_key]
    return cmd + list(extra_args)


def _vllm_executable() -> str:
    found = shutil.which("vllm") or shutil.which("vllm", path=str(Path(sys.executable).parent))
    return found or "vllm"


def vllm_available() -> bool:
    """Whether vLLM is installed (its package and its ``vllm`` command)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None and bool(
        shutil.which("vllm") or shutil.which("vllm", path=str(Path(sys.executable).parent))
    )


def serve_vllm(
    spec: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> int:
    """Run ``vllm serve`` on the checkpoint as a child process; returns its exit code.

    Raises:
        ImportError: If vLLM is not installed.
        ValueError: For ``tiny``, which exists only in-process.
    """
    if not vllm_available():
        raise ImportError(VLLM_HINT)
    path = resolve_model(spec)
    if path == "tiny":
        raise ValueError("the tiny test model exists only in-process; vLLM needs a directory")
    if path == "smollm2":
        from mage_rl.policy.models import SMOLLM2_CACHE_NAME, _cache_root, load_model

        target = _cache_root(None) / SMOLLM2_CACHE_NAME
        if not (target / "config.json").exists():
            load_model("smollm2", dtype="fp32", device="cpu")  # converts once into the cache
        path = str(target)
    cmd = vllm_command(
        path, host=host, port=port, api_key=api_key,
        served_model_name=served_model_name or spec, extra_args=extra_args,
    )  # fmt: skip
    _warn_if_exposed(host, api_key)
    shown = [("***" if i > 0 and cmd[i - 1] == "--api-key" else c) for i, c in enumerate(cmd)]
    logger.info("running: %s", " ".join(shown))
    process = subprocess.Popen(cmd, env=os.environ.copy())
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()


def _warn_if_exposed(host: str, api_key: str | None) -> None:
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        logger.warning(
            "serving on %s without --api-key: anyone who can reach this address can use "
            "the model", host
        )  # fmt: skip
