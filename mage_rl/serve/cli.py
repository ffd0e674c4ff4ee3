"""The ``mage serve`` sub-command.

:func:`register` adds it to the ``mage`` parser (``mage_rl.cli.build_parser`` calls it,
as it does the ``eval`` and ``bench`` parsers); the server modules are imported only when
the command runs.
"""

from __future__ import annotations

import argparse
import logging

from mage_rl.serve.launch import resolve_api_key, serve_local, serve_vllm

log = logging.getLogger(__name__)


def _cmd_serve(args: argparse.Namespace) -> int:
    api_key = resolve_api_key(args.api_key, args.api_key_file)
    if args.engine == "vllm":
        if args.agent:
            raise ValueError(
                "--agent runs the agent's graph on the local engine; drop --engine vllm "
                "(or serve the model with vLLM and bind the agent to it in Python: "
                "mage_rl.load_agent(RUN, endpoint=URL, endpoint_model=NAME))"
            )
        return serve_vllm(
            args.model, host=args.host, port=args.port, api_key=api_key,
            served_model_name=args.served_model_name, extra_args=args.vllm_arg,
            insecure=args.insecure, dtype=args.dtype or "auto",
        )  # fmt: skip
    if args.max_body_mb <= 0:
        raise ValueError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    if not args.agent and (
        args.max_sessions is not None or args.session_idle is not None or args.state_dir
    ):
        raise ValueError("--max-sessions, --session-idle and --state-dir are for --agent")
    serve_local(
        args.model,
        agent=args.agent,
        max_sessions=args.max_sessions,
        session_idle_s=args.session_idle,
        state_dir=args.state_dir,
        host=args.host,
        port=args.port,
        api_key=api_key,
        insecure=args.insecure,
        max_body_bytes=int(args.max_body_mb * (1 << 20)),
        body_timeout_s=args.body_timeout,
        drain_timeout_s=args.drain_timeout,
        header_timeout_s=args.header_timeout,
        prefix_cache_entries=args.prefix_cache_entries,
        served_model_name=args.served_model_name,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size,
        batch_wait_ms=args.batch_wait_ms,
        default_max_tokens=args.default_max_tokens,
        seed=args.seed,
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the ``mage`` sub-command parser."""
    p = sub.add_parser(
        "serve",
        help="serve a model or trained checkpoint behind an OpenAI-compatible API",
        description="Serve MODEL_OR_CHECKPOINT (tiny, smollm2, an HF directory or .gguf, "
        "a checkpoint such as runs/NAME/checkpoints/iter_000012, or a run folder runs/NAME "
        "for its newest checkpoint) on /v1/chat/completions, /v1/completions and /v1/models. Concurrent "
        "requests share forward passes in the local batched engine; --engine vllm runs "
        "vLLM's OpenAI server on the same checkpoint instead (GPU, or CPU from the "
        ".venv-vllm environment of scripts/setup.sh vllm).",
    )
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT")
    p.add_argument(
        "--agent",
        action="store_true",
        help="MODEL_OR_CHECKPOINT is a training run: serve its trained agent too (its "
        "graph, prompts and memory, every call on the trained weights) under the run "
        "folder's name, one session per client game (docs/serving.md, 'Serving an agent')",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; the loopback default keeps the server private, and any "
        "other needs an API key (or --insecure)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route but /health; other local "
        "users can read it in ps, so prefer --api-key-file or the MAGE_API_KEY variable",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="read the API key from the first line of this file (default: MAGE_API_KEY)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without an API key (refused otherwise)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long requests in flight may take to finish before they "
        "are cancelled; the server then exits 0",
    )
    p.add_argument(
        "--engine",
        choices=["local", "vllm"],
        default="local",
        help="local: batched transformers engine (CPU or GPU); vllm: run vLLM's server "
        "(mage starts it, waits for it and stops it on Ctrl-C or SIGTERM)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients pass as model (default: MODEL_OR_CHECKPOINT as given)",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["auto", "bf16", "fp32"],
        help="auto (the default; with --agent, the run's policy.dtype): bf16 where the "
        "hardware computes it natively (both engines)",
    )
    g = p.add_argument_group("local engine")
    g.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="most requests decoded together (more: throughput; fewer: latency)",
    )
    g.add_argument(
        "--batch-wait-ms",
        type=float,
        default=5.0,
        help="how long a batch waits for more requests before it starts",
    )
    g.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="response limit when a request sets none (default: the rest of the context)",
    )
    g.add_argument("--seed", type=int, default=0, help="seeds requests that carry no seed")
    g.add_argument(
        "--max-body-mb",
        type=float,
        default=2.0,
        help="largest request body in MiB, refused with 413 before it is read or tokenized",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="time a request body may take to arrive (a client that sends fewer bytes than "
        "its Content-Length gets 408)",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time a connection may take to send a request's headers; a slower one gets "
        "408 and is closed",
    )
    g.add_argument(
        "--prefix-cache-entries",
        type=int,
        default=1024,
        metavar="N",
        help="most prompts whose keys and values are kept for reuse by later prompts that "
        "share their prefix (0: no reuse); with small models this bounds the server's "
        "memory under load",
    )
    g = p.add_argument_group("agent sessions (--agent)")
    g.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        metavar="N",
        help="most client games open at once; one more is refused with 429 (default 256)",
    )
    g.add_argument(
        "--session-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a session with no request for this long is closed; its next result is "
        "refused as expired (default 600)",
    )
    g.add_argument(
        "--state-dir",
        default=None,
        metavar="PATH",
        help="where each session's log is kept, so that a restarted server resumes its "
        "sessions (default: RUN/sessions)",
    )
    g = p.add_argument_group("vllm engine")
    g.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to vLLM's server, repeatable (e.g. --vllm-arg=--max-model-len=8192)",
    )
    p.set_defaults(func=_cmd_serve)
