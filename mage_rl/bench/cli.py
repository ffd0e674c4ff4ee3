"""The ``mage bench`` sub-commands: one parser per benchmark.

:func:`register` adds ``bench`` to the ``mage`` parser. Each benchmark has its own
sub-parser with only the flags it reads, so a flag meant for another benchmark is an
error rather than silently ignored. Every benchmark takes ``--threads`` (torch's
intra-op threads for the whole command: learning curves on a CPU depend on it, see
:mod:`mage_rl.provenance`), and every results file goes through
:func:`~mage_rl.provenance.write_results`, which records the thread count, the commit,
the package versions, the CPU, the command line and the wall time.

The benchmark modules (models, graphs, OpenSpiel) are imported only when a command runs,
so ``mage --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

from mage_rl.bench.hardware import MODELS as HARDWARE_MODELS
from mage_rl.bench.learning_cli import add_learning_parser
from mage_rl.bench.rollout import POPULATIONS
from mage_rl.bench.threads import apply_threads
from mage_rl.console import console
from mage_rl.provenance import write_results

log = logging.getLogger(__name__)

BENCHMARKS = (
    "rollout",
    "learner",
    "learner-batch",
    "memory",
    "serve",
    "vllm",
    "textenvs",
    "learning",
    "reuse",
    "layouts",
    "hardware",
    "sampling",
    "view",
)


# -- commands ----------------------------------------------------------------------------


def _throughput(name: str, *flags: str, **derived: Callable[[argparse.Namespace], Any]):
    """The command of the throughput benchmark ``mage_rl.bench.<name>``.

    It calls ``bench_<name>`` with the parsed ``flags`` (argparse destinations that are
    the function's keywords) and the ``derived`` keywords (computed from the parsed
    arguments), under ``--threads``, prints ``format_<name>_report`` and saves ``--json``.
    """

    def run(args: argparse.Namespace) -> int:
        module = importlib.import_module(f"mage_rl.bench.{name}")
        settings = {flag: getattr(args, flag) for flag in flags}
        settings.update({key: compute(args) for key, compute in derived.items()})
        started = time.time()
        apply_threads(args.threads)
        result = getattr(module, f"bench_{name}")(**settings)
        print(getattr(module, f"format_{name}_report")(result))
        _save(args, result, started)
        return 0

    return run


_MODEL = ("model", "seed")
_DECODING = ("max_tokens", "dtype", "rounds")


def _textenv_specs(args: argparse.Namespace) -> list[str]:
    from mage_rl.bench.textenvs import DEFAULT_SPECS

    return args.variant or list(DEFAULT_SPECS)


def _add_config(p: argparse.ArgumentParser) -> None:
    """CONFIG and ``--set``, for the benchmarks that build a training config's trainer."""
    p.add_argument("config", help="a training config file, say configs/rps_smollm2.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, as mage train --set")  # fmt: skip


def _save(args: argparse.Namespace, result: dict[str, Any], started: float) -> None:
    """Write the raw result to ``--json`` (when given) with its provenance."""
    if args.json:
        path = write_results(args.json, result, started=started, threads_requested=args.threads)
        console.print(f"raw result: {path}")


# -- parsers -----------------------------------------------------------------------------


class _BenchmarkParser(argparse.ArgumentParser):
    """A benchmark's parser: a flag it does not read is refused here, under its own name
    (argparse would otherwise hand it back to ``mage``, whose message names no benchmark)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Any = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(
                f"unrecognized arguments: {' '.join(extras)} (this benchmark's flags: "
                f"{self.prog} --help)"
            )
        return parsed, extras


def _add_common(p: argparse.ArgumentParser, *, json: bool = True) -> None:
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for the whole benchmark (default: one per core); recorded in "
        "the results",
    )
    if json:
        p.add_argument("--json", default=None, help="also write the raw result to this file")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="tiny, smollm2 or an HF model path")
    p.add_argument("--seed", type=int, default=0)


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--rounds", type=int, default=1, help="repeat each mode, alternating")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench`` and its benchmarks to the ``mage`` sub-command parser."""
    bench = sub.add_parser(
        "bench",
        help="benchmarks measured on this machine (ratios in one run)",
        description="Throughput benchmarks (rollout, learner, serve, reuse, layouts, vllm) "
        "report ratios measured back to back in one process; hardware measures the learner "
        "and the engine against the machine's measured peak; textenvs times the Java text "
        "worlds; learning runs the learning probes. See docs/benchmarks.md.",
    )
    benches = bench.add_subparsers(
        dest="what", required=True, metavar="BENCHMARK", parser_class=_BenchmarkParser
    )

    p = benches.add_parser("rollout", help="batched vs sequential decoding of meta-episodes")
    _add_model(p)
    p.add_argument("--meta-episodes", type=int, default=16, help="concurrent meta-episodes")
    p.add_argument("--env", default="kuhn_poker", choices=list(POPULATIONS))
    p.add_argument("--episodes", type=int, default=3, help="K")
    _add_decoding(p)
    _add_common(p)
    p.set_defaults(
        func=_throughput("rollout", *_MODEL, *_DECODING, "meta_episodes", "env", "episodes")
    )

    p = benches.add_parser("reuse", help="rollout time with and without KV prefix reuse")
    _add_model(p)
    p.add_argument("--meta-episodes", type=int, default=16, help="concurrent meta-episodes")
    p.add_argument("--env", default="kuhn_poker", choices=list(POPULATIONS))
    p.add_argument("--episodes", type=int, default=3, help="K")
    p.add_argument("--layout", default="conversation", choices=["conversation", "rerendered"])
    _add_decoding(p)
    _add_common(p)
    p.set_defaults(
        func=_throughput("reuse", *_MODEL, *_DECODING, "meta_episodes", "env", "episodes", "layout")
    )

    p = benches.add_parser(
        "layouts", help="re-rendered vs conversation layout: rollouts (reuse off/on) and learner"
    )
    _add_model(p)
    p.add_argument("--env", default="kuhn_poker", choices=list(POPULATIONS))
    p.add_argument("--prompt", default="compact", choices=["compact", "standard"])
    p.add_argument(
        "--constrain", action=argparse.BooleanOptionalAction, default=True,
        help="constrained decoding of the action (--no-constrain: free answers)",
    )  # fmt: skip
    p.add_argument("--meta-episodes", type=int, default=8, help="concurrent meta-episodes")
    p.add_argument("--episodes", type=int, default=3, help="K")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--repeats", type=int, default=1, help="timed learner updates per layout")
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "layouts",
            *_MODEL,
            "env",
            "prompt",
            "constrain",
            "meta_episodes",
            "episodes",
            "max_tokens",
            "dtype",
            "repeats",
        )  # fmt: skip
    )

    p = benches.add_parser("learner", help="PPO update throughput, bf16 vs fp32 forward pass")
    _add_model(p)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=300)
    p.add_argument("--response-len", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--prompt-spread", type=int, default=0, help="prompt lengths vary by +- this many tokens"
    )
    p.add_argument("--kl-coef", type=float, default=0.1, help="0: no reference forward pass")
    p.add_argument(
        "--variants",
        type=lambda text: [v for v in text.split(",") if v],
        default=None,
        help="learner settings to compare instead of bf16 vs fp32, comma-separated "
        "DTYPE[:MICRO_BATCH_TOKENS][:RESCORE], say fp32:8192,fp32:1024 or "
        "bf16:1024:before,bf16:1024:fused (RESCORE: recorded, before, fused)",
    )
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "learner",
            *_MODEL,
            "samples",
            "prompt_len",
            "response_len",
            "repeats",
            "prompt_spread",
            "kl_coef",
            "variants",
        )  # fmt: skip
    )

    p = benches.add_parser(
        "learner-batch",
        help="the learner on a training config's own batches: padded rows vs prefix trees",
        description="Plays real rollouts of CONFIG with the untrained policy and times "
        "Learner.update on them with right-padded rows and with prefix trees (shared "
        "prefixes computed once), alternating, after checking that both give the same "
        "gradient on one mini-batch.",
    )
    _add_config(p)
    p.add_argument("--batches", type=int, default=1, help="iterations of rollouts to play")
    p.add_argument("--repeats", type=int, default=2, help="timed updates per layout and batch")
    _add_common(p)
    p.set_defaults(
        func=_throughput("learner_batch", "config", "batches", "repeats", sets=lambda a: a.set)
    )

    p = benches.add_parser(
        "memory",
        help="a training config's memory per phase: RSS, in use, kept free, the peak",
        description="Builds CONFIG's trainer and plays ITERATIONS iterations; after set-up "
        "and each phase reports the resident memory, glibc's memory in use and kept free, "
        "and the highest RSS during the phase.",
    )
    _add_config(p)
    p.add_argument("--iterations", type=int, default=4, help="iterations to play")
    p.add_argument(
        "--keep-free",
        dest="release",
        action="store_false",
        help="keep the allocator's free memory (as before training handed it back)",
    )
    p.add_argument("--tree-pad", type=int, default=None, metavar="N",
                   help="pad prefix trees to a multiple of N nodes (1: unpadded, as before)")  # fmt: skip
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "memory", "config", "iterations", "release", "tree_pad", sets=lambda a: a.set
        )
    )

    p = benches.add_parser(
        "sampling",
        help="the engine's sampling step against a plain sort and multinomial",
        description="Times turning a (batch, vocabulary) block of bf16 logits into one "
        "token per row, as the engine does at each decode step, against a stable sort of "
        "the whole vocabulary and one torch.multinomial per row; no model is loaded.",
    )
    p.add_argument("--batches", default="1,16,64", help="rows per step, comma-separated")
    p.add_argument("--vocab", type=int, default=49152, help="vocabulary size (SmolLM2's)")
    p.add_argument("--repeats", type=int, default=10, help="timed calls; the fastest counts")
    p.add_argument("--seed", type=int, default=0)
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "sampling", "vocab", "repeats", "seed",
            batches=lambda a: [int(b) for b in a.batches.split(",")],
        )  # fmt: skip
    )

    p = benches.add_parser("serve", help="mage serve requests/s at 1 vs 16 concurrent clients")
    _add_model(p)
    p.add_argument("--clients", default="1,16", help="concurrent client counts, comma-separated")
    p.add_argument("--requests", type=int, default=32, help="chat completions per client count")
    p.add_argument(
        "--long-tokens", type=int, default=3000, help="head-of-line test: the long request's tokens"
    )
    p.add_argument(
        "--short-tokens", type=int, default=16, help="head-of-line test: the short request's tokens"
    )
    p.add_argument(
        "--delay", type=float, default=1.0, help="head-of-line test: seconds between the two"
    )
    p.add_argument("--prefix-cache-mb", type=float, default=1024, help="0 turns reuse off")
    p.add_argument("--prefill-tokens", type=int, default=512, help="most tokens per prefill")
    _add_decoding(p)
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "serve",
            *_MODEL,
            *_DECODING,
            "requests",
            "threads",
            "long_tokens",
            "short_tokens",
            "prefix_cache_mb",
            "prefill_tokens",
            clients=lambda a: [int(c) for c in a.clients.split(",")],
            delay_s=lambda a: a.delay,
        )  # fmt: skip
    )

    p = benches.add_parser(
        "textenvs",
        help="reset and step times of ScienceWorld and TextWorld-Express",
        description="Simulator start, reset and step times of the Java text worlds, and "
        "whether their winning paths win (needs the textworlds extra and Java).",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SPEC",
        help="a task variant to time (repeatable; default "
        "scienceworld:find-non-living-thing:train and textworld_express:coin:train:small)",
    )
    p.add_argument("--episodes", type=int, default=5, help="seeds per variant")
    p.add_argument("--seed", type=int, default=0, help="first task seed")
    _add_common(p)
    p.set_defaults(func=_throughput("textenvs", "episodes", "seed", specs=_textenv_specs))

    p = benches.add_parser(
        "vllm", help="Kuhn rollouts through a vLLM server vs the local engine (vLLM installed)"
    )
    _add_model(p)
    p.add_argument("--meta-episodes", type=int, default=16, help="concurrent meta-episodes")
    p.add_argument("--episodes", type=int, default=3, help="K")
    p.add_argument("--max-tokens", type=int, default=48, help="new tokens per LLM call, at most")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--engines", default="vllm,local", help="engines to run, in this order")
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "vllm",
            *_MODEL,
            "meta_episodes",
            "episodes",
            "max_tokens",
            "dtype",
            engines=lambda a: a.engines.split(","),
        )  # fmt: skip
    )

    p = benches.add_parser(
        "hardware",
        help="learner and engine as a share of this machine's measured peak",
        description="Measures a large matmul and a memory copy, then the learner's PPO "
        "update and the engine's decode on the same device, as tokens/s and as a share of "
        "the measured peak (arithmetic: mage_rl/bench/hardware.py, docs/cluster.md).",
    )
    p.add_argument("--model", default="smollm2", choices=HARDWARE_MODELS)
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: CUDA if any")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--samples", type=int, default=16, help="samples per learner update")
    p.add_argument("--prompt-len", type=int, default=300)
    p.add_argument("--response-len", type=int, default=40)
    p.add_argument("--kl-coef", type=float, default=0.1, help="0: no reference forward pass")
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=2, help="timed learner updates")
    p.add_argument("--batch-sizes", default="1,16,64", help="engine batch sizes, comma-separated")
    p.add_argument("--decode-tokens", type=int, default=32, help="tokens decoded per request")
    p.add_argument("--rounds", type=int, default=1, help="decode timings per batch size")
    p.add_argument("--matmul-size", type=int, default=0, help="0: 2048 on CPU, 8192 on CUDA")
    p.add_argument("--copy-mib", type=int, default=0, help="0: 512 on CPU, 2048 on CUDA")
    p.add_argument("--gradient-checkpointing", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--tokenizer", default=None, help="SmolLM2 tokenizer folder (Qwen3 shapes)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="profile one learner update and a short decode per batch size",
    )
    p.add_argument(
        "--static-decode",
        default=None,
        help="decode modes to time, comma-separated among off, eager, graphs (CUDA); "
        "default: graphs,off on CUDA, off on a CPU",
    )
    p.add_argument("--seed", type=int, default=0)
    _add_common(p)
    p.set_defaults(
        func=_throughput(
            "hardware",
            "model",
            "device",
            "dtype",
            "samples",
            "prompt_len",
            "response_len",
            "kl_coef",
            "micro_batch_tokens",
            "repeats",
            "decode_tokens",
            "rounds",
            "matmul_size",
            "copy_mib",
            "gradient_checkpointing",
            "tokenizer",
            "profile",
            "seed",
            batch_sizes=lambda a: [int(b) for b in a.batch_sizes.split(",") if b],
            static_decode=lambda a: a.static_decode.split(",") if a.static_decode else None,
        )  # fmt: skip
    )

    p = benches.add_parser(
        "view",
        help="how fast mage view opens the page of a large run (headless Chromium)",
        description="Makes a run folder of --meta-episodes training meta-episodes from the "
        "saved samples of RUN, writes its page with mage view and times it in headless "
        "Chromium: the first page drawn, and a meta-episode of the last chunk opened.",
    )
    p.add_argument("run", metavar="RUN", help="a training run with saved samples")
    p.add_argument("--meta-episodes", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3, help="page loads timed")
    _add_common(p)
    p.set_defaults(func=_throughput("view", "run", "meta_episodes", "rounds"))

    add_learning_parser(benches, _add_common)
