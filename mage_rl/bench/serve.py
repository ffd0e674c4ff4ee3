"""Serving throughput: one client at a time versus many concurrent clients.

What it measures:

1. Load the model once and start the real server (:func:`~mage_rl.serve.create_app` on
   uvicorn, loopback, a free port) over one batched
   :class:`~mage_rl.policy.engine.LocalEngine` whose ``max_batch_size`` is the largest
   client count. One short request warms it up before any clock starts.
2. For each client count ``c``: ``c`` clients (asyncio tasks sharing one
   ``openai.AsyncOpenAI`` HTTP client) send the same ``requests`` chat completions in a
   closed loop: each client sends its next request as soon as the previous one is
   answered. Request ``i`` has a fixed prompt (a short Kuhn Poker decision, varied by
   card and history) and the sampling seed ``seed + i``, so every client count samples
   the same responses and generates the same number of tokens, up to rare last-bit
   differences of padded batches (the report shows each level's token count).
3. Report wall time, requests per second, generated tokens per second (``usage`` of the
   responses), latency (mean, p50, p95), the engine's admissions and mean batch (rows
   sampled together per decode step) over the level, and process CPU time over wall
   time.
4. Head-of-line blocking: one streamed request generating ``long_tokens`` tokens
   (``ignore_eos``, so it cannot end early) starts; ``delay_s`` after its first token, a
   request for ``short_tokens`` tokens is sent, and its latency is timed. With continuous
   batching it joins the running decode loop at the next step instead of waiting for the
   long one to finish. The long request is then abandoned (which cancels it).

The ratio of the largest client count to one client, of requests/s and tokens/s, is the
claim: how much batching concurrent requests into shared forward passes buys over HTTP;
with it, the mean batch at the largest count and the short request's latency. Absolute
figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mage_rl.policy.models import DType

logger = logging.getLogger(__name__)

CARDS = ("J", "Q", "K")
HISTORIES = (
    "You act first.",
    "Your opponent checked (PASS).",
    "Your opponent bet 1 chip (BET).",
    "You checked and your opponent bet 1 chip.",
)


def bench_prompt(i: int) -> list[Any]:
    """The chat of request ``i``: a Kuhn Poker decision, varied by card and history."""
    card, history = CARDS[i % 3], HISTORIES[(i // 3) % len(HISTORIES)]
    return [
        {
            "role": "system",
            "content": "You are playing Kuhn Poker (cards J < Q < K, ante 1 chip). Think "
            "briefly, then answer with <action>BET</action> or <action>PASS</action>.",
        },
        {"role": "user", "content": f"Your card is {card}. {history} What do you do?"},
    ]


def bench_serve(
    model: str = "smollm2",
    clients: Sequence[int] = (1, 16),
    requests: int = 32,
    max_tokens: int = 32,
    dtype: DType = "auto",
    seed: int = 0,
    rounds: int = 1,
    threads: int | None = None,
    on_request: Callable[[int], None] | None = None,
    long_tokens: int = 3000,
    short_tokens: int = 16,
    delay_s: float = 1.0,
    prefix_cache_mb: float = 1024,
    prefill_tokens: int = 512,
) -> dict[str, Any]:
    """Time ``requests`` chat completions through the HTTP server at each client count.

    Args:
        model: Model spec for :func:`~mage_rl.policy.models.load_model` (``smollm2``,
            ``tiny`` or a path).
        clients: Concurrent client counts, run in this order on the same server.
        requests: Chat completions per client count (the same ones at every count).
        max_tokens: Response limit of every request.
        dtype: Model dtype: ``auto``, ``bf16`` or ``fp32``.
        seed: Sampling seed of request 0 (request ``i`` uses ``seed + i``) and engine seed.
        rounds: Times each client count runs, the counts alternating; each reports its
            fastest round. Other processes can only add time, so on a shared machine the
            fastest round is the best estimate of the machine's own speed.
        threads: Torch intra-op threads for the run (``None`` keeps torch's default, one
            per core). On a machine other processes keep busy, one thread avoids the
            OpenMP barrier waits that slow multi-threaded forward passes unevenly.
        on_request: Called with the client count each time a request is answered (for
            progress bars).
        long_tokens: Head-of-line test: tokens of the long request (capped by the
            context); 0 skips the test.
        short_tokens: Tokens of the short request sent behind it.
        delay_s: Seconds between the long request's first token and the short request.
        prefix_cache_mb: The engine's prefix cache (0 turns prefix reuse off). It is
            emptied before every level and before the head-of-line test, so no level
            reuses the prompts of another (every level sends the same ones).
        prefill_tokens: The engine's most prompt tokens per prefill pass.

    Returns:
        ``{"config": {...}, "levels": {c: {...}}, "ratios": {...}}``. Each level has
        ``clients``, ``requests``, ``wall_s``, ``requests_per_s``, ``completion_tokens``,
        ``tokens_per_s``, ``latency_mean_s``, ``latency_p50_s``, ``latency_p95_s``,
        ``batches`` (prefill passes), ``mean_batch`` (rows per decode step),
        ``prefilled_tokens`` and ``reused_tokens`` (prompt tokens prefilled, and reused
        from the prefix cache), ``cpu_cores``
        and ``round_wall_s`` (every round's wall time). ``ratios`` compares the largest
        client count with the smallest (``requests_per_s`` and ``tokens_per_s``); it is
        empty when only one count ran. ``head_of_line`` (absent when ``long_tokens`` is
        0) has ``short_latency_s``, ``short_tokens``, ``long_tokens`` (asked),
        ``long_tokens_before`` (streamed before the short request was sent) and
        ``long_still_running`` (when the short one was answered).

    Raises:
        ValueError: On a client count or ``requests`` below 1, repeated client counts, or
            ``max_tokens`` below 1.
        ImportError: If the serve extra (fastapi, uvicorn, openai) is missing.
    """
    import torch

    clients = tuple(int(c) for c in clients)
    if not clients or min(clients) < 1 or len(set(clients)) != len(clients):
        raise ValueError(f"clients={list(clients)}: give distinct client counts >= 1")
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if long_tokens < 0 or short_tokens < 1 or delay_s < 0:
        raise ValueError(
            f"long_tokens={long_tokens}, short_tokens={short_tokens}, delay_s={delay_s}: "
            "give long_tokens >= 0 (0 skips the test), short_tokens >= 1 and delay_s >= 0"
        )
    try:
        import openai  # noqa: F401 - checked here for a clear message
    except ImportError as error:
        raise ImportError(
            "bench serve needs the serve extra: pip install 'mage-rl[serve]'"
        ) from error
    from mage_rl.policy.models import resolve_dtype

    # The HTTP clients log every request at INFO; a benchmark's log should show its levels.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(max(logging.getLogger(name).level, logging.WARNING))
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        used_threads = torch.get_num_threads()
        runs, head = _measure(
            model, clients, requests, max_tokens, dtype, seed, rounds, on_request,
            (long_tokens, short_tokens, delay_s),
            {"prefix_cache_mb": prefix_cache_mb, "prefill_tokens": prefill_tokens},
        )  # fmt: skip
    finally:
        torch.set_num_threads(previous_threads)
    levels = {}
    for count, done in runs.items():
        fastest = min(done, key=lambda r: r["wall_s"])
        levels[count] = {**fastest, "round_wall_s": [r["wall_s"] for r in done]}
    ratios: dict[str, float] = {}
    if len(clients) > 1:
        low, high = levels[min(clients)], levels[max(clients)]
        for key in ("requests_per_s", "tokens_per_s"):
            ratios[key] = high[key] / max(low[key], 1e-12)
    return {
        "config": {
            "model": model,
            "dtype": str(resolve_dtype(dtype)).removeprefix("torch."),
            "clients": list(clients),
            "requests": requests,
            "max_tokens": max_tokens,
            "seed": seed,
            "rounds": rounds,
            "max_batch_size": max(*clients, 2),
            "torch_threads": used_threads,
            "prefix_cache_mb": prefix_cache_mb,
            "prefill_tokens": prefill_tokens,
        },
        "levels": levels,
        "ratios": ratios,
        **({"head_of_line": head} if head else {}),
    }


def _measure(
    model: str,
    clients: tuple[int, ...],
    requests: int,
    max_tokens: int,
    dtype: DType,
    seed: int,
    rounds: int,
    on_request: Callable[[int], None] | None,
    head_of_line: tuple[int, int, float],
    engine_options: dict[str, Any],
) -> tuple[dict[int, list[dict[str, Any]]], dict[str, Any] | None]:
    """Start the server, run every client count ``rounds`` times (alternating), then the
    head-of-line test."""
    import openai

    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model
    from mage_rl.serve import create_app, serve_in_thread

    lm, tokenizer = load_model(model, dtype=dtype)
    runs: dict[int, list[dict[str, Any]]] = {count: [] for count in clients}
    batch = max(*clients, 2)  # the head-of-line test needs two rows
    with (
        LocalEngine(
            lm, tokenizer, max_batch_size=batch, seed=seed, name=model, **engine_options
        ) as engine,
        serve_in_thread(create_app(engine, model)) as url,
    ):
        warm = openai.OpenAI(base_url=url, api_key="bench", max_retries=0)
        warm.chat.completions.create(model=model, messages=bench_prompt(0), max_tokens=4)
        for _ in range(rounds):
            for count in clients:
                logger.info("bench serve: %d requests from %d client(s)", requests, count)
                _forget_prefixes(engine)
                level = _run_level(
                    engine, url, model, count, requests, max_tokens, seed, on_request
                )
                runs[count].append(asyncio.run(level))
                logger.info(
                    "bench serve, %d client(s): %.1fs, %.2f requests/s, %.1f tokens/s",
                    count, runs[count][-1]["wall_s"], runs[count][-1]["requests_per_s"],
                    runs[count][-1]["tokens_per_s"],
                )  # fmt: skip
        head = None
        if head_of_line[0] > 0:
            _forget_prefixes(engine)
            head = asyncio.run(_head_of_line(engine, url, model, seed, *head_of_line))
            logger.info(
                "bench serve: %d-token request behind a %d-token one answered in %.2fs",
                head["short_tokens"], head["long_tokens"], head["short_latency_s"],
            )  # fmt: skip
    return runs, head


def _forget_prefixes(engine: Any) -> None:
    """Empty the engine's prefix cache: a level must not reuse an earlier level's prompts."""
    if engine.prefix_cache is not None:
        engine.prefix_cache.clear()


async def _run_level(
    engine: Any,
    url: str,
    model: str,
    clients: int,
    requests: int,
    max_tokens: int,
    seed: int,
    on_request: Callable[[int], None] | None,
) -> dict[str, Any]:
    """Send ``requests`` requests from ``clients`` closed-loop clients; measure."""
    import openai

    latencies: list[float] = []
    tokens = 0
    stats = engine.stats
    batches, steps, rows = stats.batches, stats.steps, stats.step_rows
    prefilled, reused = stats.prompt_tokens, stats.reused_tokens

    async def client(aclient: openai.AsyncOpenAI, indices: range) -> None:
        nonlocal tokens
        for i in indices:
            start = time.perf_counter()
            reply = await aclient.chat.completions.create(
                model=model, messages=bench_prompt(i), max_tokens=max_tokens, temperature=1.0,
                seed=seed + i,
            )  # fmt: skip
            latencies.append(time.perf_counter() - start)
            tokens += reply.usage.completion_tokens if reply.usage else 0
            if on_request:
                on_request(clients)

    # One HTTP client for all; its pool (up to 1,000 connections) gives each client its own.
    async with openai.AsyncOpenAI(
        base_url=url, api_key="bench", max_retries=0, timeout=600
    ) as aclient:
        start, cpu_start = time.perf_counter(), time.process_time()
        await asyncio.gather(
            *(client(aclient, range(w, requests, clients)) for w in range(clients))
        )
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    ordered = sorted(latencies)
    return {
        "clients": clients,
        "requests": len(latencies),
        "wall_s": wall,
        "requests_per_s": len(latencies) / wall,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "latency_mean_s": statistics.fmean(latencies),
        "latency_p50_s": ordered[len(ordered) // 2],
        "latency_p95_s": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "batches": stats.batches - batches,
        "mean_batch": (stats.step_rows - rows) / max(stats.steps - steps, 1),
        "prefilled_tokens": stats.prompt_tokens - prefilled,
        "reused_tokens": stats.reused_tokens - reused,
        "cpu_cores": cpu / wall,
    }


async def _head_of_line(
    engine: Any,
    url: str,
    model: str,
    seed: int,
    long_tokens: int,
    short_tokens: int,
    delay_s: float,
) -> dict[str, Any]:
    """Time a short request sent while a long one decodes (see the module docstring)."""
    import openai

    from mage_rl.policy.tokenization import render_prompt

    prompt_len = len(render_prompt(engine.tokenizer, bench_prompt(0)))
    long_tokens = min(long_tokens, engine.max_context - prompt_len - 1)
    streamed = 0
    first = asyncio.Event()
    async with openai.AsyncOpenAI(
        base_url=url, api_key="bench", max_retries=0, timeout=600
    ) as aclient:

        async def run_long() -> None:
            nonlocal streamed
            stream = await aclient.chat.completions.create(
                model=model, messages=bench_prompt(0), max_tokens=long_tokens, seed=seed,
                stream=True, extra_body={"ignore_eos": True},
            )  # fmt: skip
            async for _chunk in stream:
                streamed += 1
                first.set()

        long = asyncio.create_task(run_long())
        await first.wait()
        await asyncio.sleep(delay_s)
        before = streamed
        start = time.perf_counter()
        reply = await aclient.chat.completions.create(
            model=model, messages=bench_prompt(1), max_tokens=short_tokens, seed=seed + 1,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        latency = time.perf_counter() - start
        still_running = not long.done()
        long.cancel()  # hang up: the server cancels the long request
        with contextlib.suppress(asyncio.CancelledError):
            await long
    return {
        "short_latency_s": latency,
        "short_tokens": reply.usage.completion_tokens if reply.usage else short_tokens,
        "long_tokens": long_tokens,
        "long_tokens_before": max(before - 1, 0),  # the first chunk carries no token
        "long_still_running": still_running,
        "delay_s": delay_s,
    }


def format_serve_report(result: dict[str, Any]) -> str:
    """A markdown table of :func:`bench_serve`'s result, one row per client count."""
    cfg = result["config"]
    lines = [
        f"Serving: {cfg['requests']} chat completions (max_tokens={cfg['max_tokens']}) per "
        f"client count through the HTTP server, model {cfg['model']} ({cfg['dtype']}), "
        f"engine max batch {cfg['max_batch_size']}, prefix cache "
        f"{cfg.get('prefix_cache_mb', 0):g} MB, {cfg.get('prefill_tokens', '-')} prefill "
        f"tokens per pass, {cfg['torch_threads']} torch threads, "
        f"seed {cfg['seed']}, fastest of {cfg['rounds']} round(s) per client count",
        "",
        "| clients | wall s | requests/s | tokens | tokens/s | latency mean s | p50 s | p95 s "
        "| mean batch | prompt tokens prefilled / reused | CPU cores |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level in result["levels"].values():
        lines.append(
            f"| {level['clients']} | {level['wall_s']:.1f} | {level['requests_per_s']:.2f} "
            f"| {level['completion_tokens']} | {level['tokens_per_s']:.1f} "
            f"| {level['latency_mean_s']:.2f} | {level['latency_p50_s']:.2f} "
            f"| {level['latency_p95_s']:.2f} | {level['mean_batch']:.1f} "
            f"| {level.get('prefilled_tokens', 0)} / {level.get('reused_tokens', 0)} "
            f"| {level['cpu_cores']:.2f} |"
        )
    ratios = result.get("ratios") or {}
    if ratios:
        counts = result["config"]["clients"]
        lines += [
            "",
            f"{max(counts)} clients / {min(counts)} client(s): {ratios['requests_per_s']:.2f}x "
            f"requests/s, {ratios['tokens_per_s']:.2f}x tokens/s; mean batch at "
            f"{max(counts)} clients: {result['levels'][max(counts)]['mean_batch']:.1f}.",
        ]
    head = result.get("head_of_line")
    if head:
        running = "still decoding" if head["long_still_running"] else "already finished"
        lines += [
            "",
            f"Head of line: a {head['short_tokens']}-token request sent {head['delay_s']:g} s "
            f"after a {head['long_tokens']}-token one started streaming (which had streamed "
            f"{head['long_tokens_before']} tokens) was answered in "
            f"{head['short_latency_s']:.2f} s; the long request was {running}.",
        ]
    return "\n".join(lines)
