"""Fuzz a served agent with hostile environment messages while good clients play.

    .venv/bin/python scripts/serve_agent_fuzz.py [--count 1500] [--clients 8] [--workers 4]
        [--load-nice 10]

Starts a server process (the tiny model behind the built-in MAGE graph with constrained
decoding, sessions logged in a temporary state directory, and one planted failure of
the agent's own code: a node that raises on an observation holding ``TRIPWIRE``), then

* ``--count`` hostile ``env`` messages, ``--workers`` at a time: wrong types, missing and
  unknown fields, non-finite numbers, oversized and empty texts, duplicate actions,
  messages out of order, guessed handles and bad ``seq`` values, prompts over the
  context; some open a session, some go to a session opened for the purpose, and a few
  trip the planted failure;
* ``--clients`` well-behaved clients (the ``openai`` SDK) playing meta-episodes
  meanwhile, each failure counted;
* ``/health`` every 20 ms, and the server's resident memory (RSS) every second.

Prints one JSON object: the statuses of the hostile messages, the 500s that are not the
planted failure, the clients' meta-episodes and failures, ``/health`` latencies and RSS.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

AGENT = "fuzzed"
ACTIONS = ["BET", "PASS"]
GAME = {"name": "kuhnish", "task_description": "Play BET or PASS.", "max_turns": 4}


def serve(port: int, state_dir: str, prefix_cache_entries: int) -> None:
    """The server process."""
    from mage_rl import runtime
    from mage_rl.graphs import GraphOptions, build_meta_episode_graph
    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model
    from mage_rl.serve import create_app, serve_in_thread
    from mage_rl.serve.agent import AgentSessions

    def tripwire(state: dict[str, Any]) -> dict[str, Any]:
        if "TRIPWIRE" in state["observation"]:
            raise RuntimeError("planted failure (TRIPWIRE)")
        return {}

    options = GraphOptions(num_episodes=3, constrain_actions=True, stop_on_success=False,
                           max_tokens=8, reflect_max_tokens=8)  # fmt: skip
    graph = build_meta_episode_graph(options, before={"play": ("tripwire", tripwire)})
    model, tokenizer = load_model("tiny", dtype="fp32")
    with LocalEngine(model, tokenizer, name="tiny",
                     prefix_cache_entries=prefix_cache_entries) as engine:  # fmt: skip
        agent = AgentSessions(graph, lambda **s: runtime.chat_model(engine, **_sampling(s)),
                              name=AGENT, state_dir=Path(state_dir), idle_s=30)  # fmt: skip
        app = create_app(engine, "tiny", agent=agent)
        with serve_in_thread(app, port=port, freeze_loaded=True):  # as `mage serve` runs
            if os.environ.get("FUZZ_GC_LOG"):
                _log_collections()
            threading.Event().wait()


def _log_collections() -> None:
    """Write every garbage collection of 20 ms or more to stderr (generation, seconds)."""
    import gc

    began: list[float] = []

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[:] = [time.perf_counter()]
        elif began and (spent := time.perf_counter() - began[0]) >= 0.02:
            print(f"gc gen {info['generation']} {spent:.3f} s at {time.time():.3f}",
                  file=sys.stderr, flush=True)  # fmt: skip

    gc.callbacks.append(timed)


def _sampling(s: dict[str, Any]) -> dict[str, Any]:
    return {"temperature": 1.0 if s.get("temperature") is None else s["temperature"]}


def start(observation: str = "You hold K.", first: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {"kind": "start", "observation": observation,
                               "legal_actions": list(ACTIONS)}  # fmt: skip
    if first:
        message["game"] = dict(GAME)
    return message


def result(done: bool = False, observation: str = "The opponent bets.") -> dict[str, Any]:
    message: dict[str, Any] = {"kind": "result", "observation": observation,
                               "result": {"reward": float(done), "done": done,
                                          "outcome": "won" if done else None}}  # fmt: skip
    if not done:
        message["legal_actions"] = list(ACTIONS)
    return message


def hostile(rng: random.Random) -> tuple[dict[str, Any], bool, str]:
    """A hostile message, whether it goes to an open session, and its kind."""
    big = "x" * rng.choice([1_001, 10_001, 100_001, 300_000])
    kinds: list[tuple[str, Any, bool]] = [
        ("duplicate actions", {**result(), "legal_actions": ["BET", "BET"]}, True),
        ("empty action", {**result(), "legal_actions": ["BET", ""]}, True),
        ("no actions", {**result(), "legal_actions": []}, True),
        ("long action", {**result(), "legal_actions": [big[:1001], "BET"]}, True),
        ("many actions", {**result(), "legal_actions": [f"a{i}" for i in range(1001)]}, True),
        ("huge observation", result(observation=big), True),
        ("context", result(observation="w " * rng.randint(3000, 40000)), True),
        ("event", {**result(), "result": {"done": False, "events": [big[:10_001]]}}, True),
        ("nan", {**result(), "result": {"reward": "NaN!", "done": False}}, True),
        ("wrong type", {**result(), "result": {"reward": "1", "done": "yes"}}, True),
        ("unknown field", {**result(), "surprise": 1}, True),
        ("start twice", start(first=False), True),
        ("game again", start(), True),
        ("no result", {"kind": "result", "observation": "?"}, True),
        ("bad kind", {"kind": rng.choice(["end", "", 3, None])}, True),
        ("not a dict", rng.choice([[1, 2], "start", 7, None]), True),
        ("wording", {**start(), "game": {**GAME, "wording": {"setting": big[:10_001]}}}, False),
        ("unknown wording", {**start(), "game": {**GAME, "wording": {"x": "y"}}}, False),
        ("max turns", {**start(), "game": {**GAME, "max_turns": 10_000}}, False),
        ("no game", start(first=False), False),
        ("orphan result", result(), False),
        ("big task", {**start(), "game": {**GAME, "task_description": big[:100_001]}}, False),
        ("tripwire", result(observation="TRIPWIRE now"), True),
    ]
    name, message, in_session = rng.choice(kinds)
    return message, in_session, name


class Fuzz:
    def __init__(self, url: str, seed: int) -> None:
        self.url = url
        self.seed = seed
        self.statuses: Counter[str] = Counter()
        self.unexpected: list[str] = []
        self.lock = threading.Lock()

    def post(self, body: Any, extra: dict[str, Any]) -> httpx.Response:
        data = {"model": AGENT, "messages": [{"role": "user", "content": "-"}], **extra,
                "env": body}  # fmt: skip
        # NaN as JSON's parser reads it (the SDK refuses to send it)
        raw = json.dumps(data).replace('"NaN!"', "NaN")
        return httpx.post(f"{self.url}/chat/completions", content=raw, timeout=120,
                          headers={"Content-Type": "application/json"})  # fmt: skip

    def one(self, i: int) -> None:
        rng = random.Random(self.seed * 100_003 + i)
        message, in_session, name = hostile(rng)
        extra: dict[str, Any] = {}
        if in_session:
            response = self.post(start(), {})
            if response.status_code != 200:  # say, 429 at the session cap: an answer too
                with self.lock:
                    self.statuses[f"start {response.status_code}"] += 1
                    if response.status_code >= 500:
                        self.unexpected.append(f"start: {response.text[:300]}")
                return
            handle = response.json()["mage"]["session"]
            extra = {"session": handle, "seq": rng.choice([1, 1, 1, 0, 7, -1])}
        elif rng.random() < 0.3:
            extra = {"session": rng.choice(["A" * 32, "short", "x" * 65, 12]), "seq": 1}
        response = self.post(message, extra)
        key = f"{response.status_code}"
        with self.lock:
            self.statuses[key] += 1
            if response.status_code >= 500 and name != "tripwire":
                self.unexpected.append(f"{name}: {response.text[:300]}")
            if name == "tripwire":
                self.statuses[f"tripwire {response.status_code}"] += 1


def probe(root: str, done: Any, out: Any) -> None:
    """``GET /health`` every 20 ms until ``done``; the latencies go to ``out``."""
    latencies = []
    with httpx.Client(timeout=30) as client:
        while not done.is_set():
            t0 = time.perf_counter()
            client.get(f"{root}/health")
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.02)
    out.put(latencies)


def good_client(url: str, stop: threading.Event, out: dict[str, int]) -> None:
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=2, timeout=120)
    while not stop.is_set():
        session: dict[str, Any] = {}
        try:
            steps = [start(), result(), result(True), start("You hold Q.", False), result(True),
                     start("You hold J.", False), result(), result(True)]  # fmt: skip
            for message in steps:
                reply = client.chat.completions.create(
                    model=AGENT, user="good", messages=[{"role": "user", "content": "-"}],
                    extra_body={"env": message, **session},
                )  # fmt: skip
                mage = reply.model_extra["mage"]
                session = {"session": mage["session"], "seq": mage["seq"] + 1}
            assert mage["meta_done"], mage
            out["meta_episodes"] += 1
        except Exception as error:  # noqa: BLE001 (counted and shown)
            out["failures"] += 1
            out.setdefault("errors", []).append(str(error)[:300])  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prefix-cache-entries", type=int, default=64,
        help="the engine's prefix cache (its memory grows with it, by design, until full)",
    )  # fmt: skip
    parser.add_argument("--server-log", default=None, help="the server's stderr goes here")
    parser.add_argument(
        "--load-nice", type=int, default=0,
        help="niceness of the clients and hostile workers (this process, once the server "
        "and the /health prober run): 10 stands in for clients on other machines, so that "
        "/health measures the server's own stalls rather than two cores shared with its load",
    )  # fmt: skip
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1], int(args.serve[2]))
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = tempfile.mkdtemp(prefix="mage-fuzz-")
    log = open(args.server_log, "wb") if args.server_log else subprocess.DEVNULL  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), state, str(args.prefix_cache_entries)],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    root, url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/v1"
    try:
        while True:
            try:
                if httpx.get(f"{root}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        stop = threading.Event()
        rss: list[float] = []
        proc = psutil.Process(server.pid)

        def sample() -> None:
            while not stop.wait(1.0):
                try:
                    rss.append(proc.memory_info().rss / 2**20)
                except psutil.NoSuchProcess:  # say how the server ended, then stop the run
                    code = server.wait()
                    print(f"the server exited after {len(rss)} s with status {code} "
                          "(negative: killed by that signal)", file=sys.stderr, flush=True)  # fmt: skip
                    os._exit(3)
                if len(rss) % 30 == 0:
                    print(f"{len(rss)} s: {rss[-1]:.0f} MB", file=sys.stderr, flush=True)

        # /health from a process of its own: the clients' threads here would hold its
        # interpreter lock, and their delays would count as the server's.
        done, receive = multiprocessing.Event(), multiprocessing.Queue()
        prober = multiprocessing.Process(target=probe, args=(root, done, receive))
        prober.start()
        if args.load_nice:
            os.nice(args.load_nice)
        good: dict[str, Any] = {"meta_episodes": 0, "failures": 0}
        threads = [threading.Thread(target=sample)]
        threads += [threading.Thread(target=good_client, args=(url, stop, good))
                    for _ in range(args.clients)]  # fmt: skip
        for thread in threads:
            thread.start()
        fuzz = Fuzz(url, args.seed)
        started = time.time()
        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(fuzz.one, range(args.count)))
        stop.set()
        done.set()
        latencies = receive.get()
        prober.join()
        for thread in threads:
            thread.join()
        ordered = sorted(latencies)
        warm = rss[min(len(rss) - 1, 60)]  # after the first minute: caches and arenas warm
        print(json.dumps({
            "hostile": args.count, "seconds": round(time.time() - started),
            "prefix_cache_entries": args.prefix_cache_entries, "load_nice": args.load_nice,
            "statuses": dict(fuzz.statuses), "unexpected_5xx": fuzz.unexpected[:20],
            "good_clients": good,
            "health": {"n": len(ordered), "p50_ms": round(1000 * ordered[len(ordered) // 2], 1),
                       "p99_ms": round(1000 * ordered[int(len(ordered) * 0.99)], 1),
                       "max_ms": round(1000 * ordered[-1], 1),
                       "over_100_ms": sum(x >= 0.1 for x in ordered),
                       "slowest_ms": [round(1000 * x) for x in ordered[-8:]]},
            "rss_mb": {"first": round(rss[0]), "after_warmup": round(warm),
                       "max": round(max(rss)), "last": round(rss[-1]),
                       "growth_after_warmup": round(rss[-1] - warm, 1)},
        }, indent=1))  # fmt: skip
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
