"""The ``mage serve`` sub-command.

:func:`register` adds it to the ``mage`` parser (``mage_rl.cli._EXTRA_PARSERS``); the
server modules are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def _cmd_serve(args: argparse.Namespace) -> int:
    from mage_rl.serve.launch import serve_local, serve_vllm

    if args.engine == "vllm":
        return serve_vllm(
            args.model, host=args.host, port=args.port, api_key=args.api_key,
            served_model_name=args.served_model_name, extra_args=args.vllm_arg,
        )  # fmt: skip
    serve_local(
        args.model,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
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
        "a checkpoint runs/NAME/checkpoints/iter_N, or a run folder runs/NAME for its newest "
        "checkpoint) on /v1/chat/completions, /v1/completions and /v1/models. Concurrent "
        "requests share forward passes in the local batched engine; --engine vllm runs "
        "'vllm serve' on the same checkpoint instead (GPU).",
    )
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; the loopback default keeps the server private",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: none)",
    )
    p.add_argument(
        "--engine",
        choices=["local", "vllm"],
        default="local",
        help="local: batched transformers engine (CPU or GPU); vllm: run vllm serve",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="the name clients pass as model (default: MODEL_OR_CHECKPOINT as given)",
    )
    g = p.add_argument_group("local engine")
    g.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
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
    g = p.add_argument_group("vllm engine")
    g.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument passed to vllm serve, repeatable (e.g. --vllm-arg=--max-model-len=8192)",
    )
    p.set_defaults(func=_cmd_serve)
