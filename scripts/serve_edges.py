"""Measure two edges of ``mage serve`` as a client would: near-limit prompts and slow headers.

    .venv/bin/python scripts/serve_edges.py prompts [--count 36] [--mb 1.9] [--concurrency 8]
    .venv/bin/python scripts/serve_edges.py headers [--count 300] [--header-timeout 10]
    .venv/bin/python scripts/serve_edges.py load [--count 3000] [--prefix-cache-entries N]

Each starts ``mage serve tiny`` on a free loopback port (the same interpreter's ``mage``)
and prints one JSON object.

* ``prompts``: ``--count`` chat requests whose one message is ``--mb`` MB of text (under
  the 2 MiB body limit, far over the tiny model's 4,096-token context), ``--concurrency``
  at a time, while a second client asks ``/health`` every 20 ms. Reports each request's
  status and seconds, the server's resident memory (RSS) before, at its peak and after,
  and the slowest ``/health`` answers.
* ``headers``: ``--count`` connections that each send half of a request's headers and then
  nothing. Reports how many the server closed, and when, within ``--header-timeout`` plus
  two seconds; then that ``/health`` still answers.
* ``load``: ``--count`` ordinary chat requests, each with its own prompt (40-100 words),
  ``--concurrency`` at a time; reports the server's RSS every ``--every`` requests (what
  the prefix cache holds grows with them up to ``--prefix-cache-entries``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

MIB = 1 << 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    mage = Path(sys.executable).with_name("mage")
    command = [str(mage), "serve", "tiny", "--port", str(port), "--dtype", "fp32", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MAGE_API_KEY", None)
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mage serve exited with {process.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("mage serve did not start")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def _probe_health(root: str, pid: int, stop: Any, out: Any) -> None:
    """In its own process (so the senders' threads do not delay it): ``/health`` every
    20 ms and the server's RSS, until ``stop`` is set; the results go to ``out``."""
    rss = psutil.Process(pid)
    latencies: list[float] = []
    peak = 0
    with httpx.Client(timeout=10) as client:
        client.get(f"{root}/health")
        while not stop.is_set():
            start = time.perf_counter()
            status = client.get(f"{root}/health").status_code
            latencies.append(time.perf_counter() - start if status == 200 else float("inf"))
            peak = max(peak, rss.memory_info().rss)
            time.sleep(0.02)
    out.put((latencies, peak))


_CLIENT: dict[str, Any] = {}


def _sender(body: bytes) -> None:
    """Pool initializer: one connection and the body per sending process."""
    _CLIENT["client"] = httpx.Client(timeout=120)
    _CLIENT["body"] = body


def _warm(url: str) -> int:
    return int(_CLIENT["client"].get(url).status_code)


def _send(url: str) -> tuple[int, float, str]:
    client, body = _CLIENT["client"], _CLIENT["body"]
    start = time.perf_counter()
    response = client.post(url, content=body, headers={"content-type": "application/json"})
    seconds = time.perf_counter() - start
    code = response.json().get("error", {}).get("code") if response.status_code != 200 else ""
    return response.status_code, seconds, str(code)


def prompts(args: argparse.Namespace) -> dict[str, object]:
    port = _free_port()
    root = f"http://127.0.0.1:{port}"
    process = _start(port, [])
    rss = psutil.Process(process.pid)
    context = multiprocessing.get_context("spawn")
    try:
        size = int(args.mb * 1e6)
        content = ("card bet pass king queen " * (size // 25 + 1))[:size]
        body = json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
        ).encode()
        small = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        # One ordinary request first, so the baseline holds a warmed-up server.
        httpx.post(f"{root}/v1/chat/completions", json=small, timeout=60).raise_for_status()
        with context.Pool(args.concurrency, _sender, (body,)) as pool:
            pool.map(_warm, [f"{root}/health"] * args.concurrency, 1)  # connected
            time.sleep(0.5)
            before = rss.memory_info().rss
            stop, out = context.Event(), context.Queue()
            prober = context.Process(target=_probe_health, args=(root, process.pid, stop, out))
            prober.start()
            time.sleep(1.0)
            results = pool.map(_send, [f"{root}/v1/chat/completions"] * args.count, 1)
        time.sleep(1.0)
        stop.set()
        health, peak = out.get(timeout=30)
        prober.join()
        after = rss.memory_info().rss
        ok_after = httpx.post(f"{root}/v1/chat/completions", json=small, timeout=60).status_code
    finally:
        _stop(process)
    seconds = sorted(s for _, s, _ in results)
    return {
        "prompts": args.count,
        "prompt_bytes": len(body),
        "concurrency": args.concurrency,
        "statuses": sorted({f"{status} {code}" for status, _, code in results}),
        "seconds_max": round(seconds[-1], 3),
        "seconds_median": round(seconds[len(seconds) // 2], 3),
        "rss_before_mib": round(before / MIB, 1),
        "rss_peak_mib": round(max(peak, after) / MIB, 1),
        "rss_after_mib": round(after / MIB, 1),
        "rss_growth_mib": round((after - before) / MIB, 1),
        "health_probes": len(health),
        "health_max_ms": round(max(health) * 1000, 1),
        "health_p99_ms": round(sorted(health)[int(len(health) * 0.99)] * 1000, 1),
        "good_request_after": ok_after,
    }


def headers(args: argparse.Namespace) -> dict[str, object]:
    port = _free_port()
    root = f"http://127.0.0.1:{port}"
    process = _start(port, ["--header-timeout", str(args.header_timeout)])
    half = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"
    selector = selectors.DefaultSelector()
    closed: list[float] = []
    try:
        start = time.monotonic()
        socks = []
        for _ in range(args.count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(half)
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            socks.append(sock)
        opened = time.monotonic() - start
        deadline = start + args.header_timeout + 2.0
        open_socks = set(socks)
        while open_socks and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                try:
                    data = sock.recv(65536)  # type: ignore[union-attr]
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                if not data:  # closed by the server (a 408 first, then EOF)
                    selector.unregister(sock)
                    open_socks.discard(sock)  # type: ignore[arg-type]
                    closed.append(time.monotonic() - start)
        healthy = httpx.get(f"{root}/health", timeout=10).status_code
        for sock in socks:
            sock.close()
    finally:
        _stop(process)
    return {
        "connections": args.count,
        "header_timeout_s": args.header_timeout,
        "seconds_to_open_all": round(opened, 2),
        "closed_by_server": len(closed),
        "still_open": args.count - len(closed),
        "first_closed_s": round(min(closed), 2) if closed else None,
        "last_closed_s": round(max(closed), 2) if closed else None,
        "health_after": healthy,
    }


def _varied(args: tuple[str, int]) -> int:
    url, i = args
    words = ["card", "bet", "pass", "king", "queen", "jack", "fold", "call", "raise", "check"]
    content = f"game {i}: " + " ".join(words[(i * 7 + j * j) % 10] for j in range(40 + i % 60))
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, "seed": i}  # fmt: skip
    return int(_CLIENT["client"].post(url, json=body).status_code)


def load(args: argparse.Namespace) -> dict[str, object]:
    port = _free_port()
    root = f"http://127.0.0.1:{port}"
    extra = [] if args.prefix_cache_entries is None else [
        "--prefix-cache-entries", str(args.prefix_cache_entries)]  # fmt: skip
    process = _start(port, extra)
    rss = psutil.Process(process.pid)
    context = multiprocessing.get_context("spawn")
    marks: dict[int, float] = {}
    try:
        with context.Pool(args.concurrency, _sender, (b"",)) as pool:
            pool.map(_warm, [f"{root}/health"] * args.concurrency, 1)
            marks[0] = rss.memory_info().rss / MIB
            url = f"{root}/v1/chat/completions"
            done, statuses = 0, set()
            while done < args.count:
                step = min(args.every, args.count - done)
                statuses |= set(pool.map(_varied, [(url, done + i) for i in range(step)], 8))
                done += step
                marks[done] = round(rss.memory_info().rss / MIB, 1)
    finally:
        _stop(process)
    return {
        "requests": args.count,
        "prefix_cache_entries": args.prefix_cache_entries or "default (1024)",
        "statuses": sorted(statuses),
        "rss_mib_after_n_requests": marks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--count", type=int, default=36)
    p.add_argument("--mb", type=float, default=1.9)
    p.add_argument("--concurrency", type=int, default=8)
    p.set_defaults(func=prompts)
    h = sub.add_parser("headers")
    h.add_argument("--count", type=int, default=300)
    h.add_argument("--header-timeout", type=float, default=10.0)
    h.set_defaults(func=headers)
    m = sub.add_parser("load")
    m.add_argument("--count", type=int, default=3000)
    m.add_argument("--every", type=int, default=500)
    m.add_argument("--concurrency", type=int, default=8)
    m.add_argument("--prefix-cache-entries", type=int, default=None)
    m.set_defaults(func=load)
    args = parser.parse_args()
    print(json.dumps(args.func(args), indent=2))


if __name__ == "__main__":
    main()
