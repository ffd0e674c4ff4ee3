"""``mage serve RUN --agent``: the trained agent's graph behind the OpenAI API.

A real uvicorn server, the real ``openai`` client, the planner example trained one
iteration on the tiny model, and Kuhn Poker played on the client's side.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from mage_rl import runtime
from mage_rl.cli import main
from mage_rl.envs import make_env
from mage_rl.envs.base import derive_seed, episode_seed
from mage_rl.envs.remote import result_message, start_message
from mage_rl.eval.settings import EVAL_TEMPERATURE, EVAL_TOP_K, EVAL_TOP_P
from mage_rl.graphs import GraphOptions, build_meta_episode_graph
from mage_rl.players.play_settings import trained_config
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.models import load_model
from mage_rl.serve import create_app, serve_in_thread
from mage_rl.serve.agent import AgentSessions
from mage_rl.serve.launch import agent_sessions
from tests.serve.conftest import wait_until_serving

EXAMPLES = Path(__file__).parents[2] / "examples" / "extending"


@pytest.fixture(scope="module")
def planner_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("served") / "planner_run"
    code = main(["train", str(EXAMPLES / "planner_kuhn_tiny.yaml"), "--run-dir", str(run),
                 "--no-progress", "--set", "train.iterations=1", "--set", "eval.tasks=0"])  # fmt: skip
    assert code == 0
    return run


def play_over_http(client: openai.OpenAI, model: str, task: dict[str, Any], episodes: int,
                   label: str) -> dict[str, Any]:  # fmt: skip
    """A client that plays one meta-episode of Kuhn Poker with the openai SDK, the game
    here, exactly as docs/serving.md shows."""
    env = make_env("kuhn_poker", task["opponent"], seat=task["seat"])
    seed = derive_seed("eval-sample", task["seed"], 0)
    calls: list[dict[str, Any]] = []
    rewards: list[float] = []
    session: dict[str, Any] = {}

    def ask(message: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        reply = client.chat.completions.create(
            model=model, user=label, seed=seed, temperature=EVAL_TEMPERATURE,
            top_p=EVAL_TOP_P, messages=[{"role": "user", "content": message["observation"]}],
            extra_body={"env": message, "top_k": EVAL_TOP_K, **session},
        )  # fmt: skip
        extra = reply.model_extra["mage"]
        session.update(session=extra["session"], seq=extra["seq"] + 1)
        calls.extend(extra["calls"])
        return reply.choices[0].message.content, extra

    for k in range(episodes):
        observation = env.reset(episode_seed(task["seed"], k, "replay"))
        action, extra = ask(start_message(env, observation, first=k == 0))
        while True:
            result = env.step(action)
            action, extra = ask(result_message(env, result))
            if result.done:
                rewards.append(result.reward)
                break
        if extra["meta_done"]:
            break
    assert extra["meta_done"]
    return {"calls": calls, "rewards": rewards, "reflections": extra["reflections"]}


def test_served_agent_plays_as_mage_eval_plays(planner_run: Path, tmp_path: Path) -> None:
    # mage eval of the run, locally: the reference.
    local = tmp_path / "local"
    assert main(["eval", "--agent", f"planner={planner_run}", "--n", "3", "--out", str(local),
                 "--no-progress"]) == 0  # fmt: skip
    tasks = json.loads((local / "tasks.json").read_text())["kuhn_poker"]["tasks"]
    expected = [json.loads(x) for x in (local / "records" / "planner" / "kuhn_poker.jsonl")
                .read_text().splitlines()]  # fmt: skip
    by_seed = {r["seed"]: r for r in expected}

    _, cfg = trained_config(planner_run)
    model, tokenizer = load_model(cfg.policy.model, dtype="fp32")
    with (
        LocalEngine(model, tokenizer, name="planner-model") as engine,
        serve_in_thread(create_app(engine, "planner-model",
                                   agent=agent_sessions(cfg, engine, "planner"))) as url,
    ):  # fmt: skip
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        cards = {c.id: c.model_extra for c in client.models.list().data}
        assert cards["planner"]["mage"] == {"agent": True, "episodes": 3, "model": "planner-model"}
        assert "planner-model" in cards  # the plain model stays available
        for i, task in enumerate(tasks):
            served = play_over_http(client, "planner", task, 3, f"game-{i}")
            record = by_seed[task["seed"]]
            mine = [(c["node"], c["kind"], c["episode"], c["text"]) for c in served["calls"]]
            theirs = [(t["node"], t["kind"], t["episode"], t["text"]) for t in record["turns"]]
            assert mine == theirs
            assert served["rewards"] == [e["reward"] for e in record["episodes"]]
            assert served["reflections"] == record["reflections"]
            # both calls of every step went to the trained weights, with the run's prompts
            steps = [c["node"] for c in served["calls"] if c["kind"] != "reflect"]
            assert steps[:2] == ["plan", "act"] and steps.count("plan") == steps.count("act")

        # mage eval of the served agent: the same tasks, the same answers.
        remote = tmp_path / "remote"
        assert main(["eval", "--agent", f"served={url}", "--n", "3", "--out", str(remote),
                     "--no-progress", "--env", "kuhn_poker", "--opponents", "train",
                     "--episodes", "3"]) == 0  # fmt: skip
    got = [json.loads(x) for x in (remote / "records" / "served" / "kuhn_poker.jsonl")
           .read_text().splitlines()]  # fmt: skip
    assert len(got) == len(expected)
    for record in got:
        ref = by_seed[record["seed"]]
        assert [t["text"] for t in record["turns"]] == [t["text"] for t in ref["turns"]]
        assert [e["reward"] for e in record["episodes"]] == [e["reward"] for e in ref["episodes"]]


# -- sessions: isolation, expiry, limits ---------------------------------------------------


def remembering_graph() -> Any:
    """A meta-episode graph whose reflection remembers the episode's first observation,
    so that each session's memory is known; its play node answers the first action."""

    async def play(state: dict[str, Any], runtime: Any) -> dict[str, Any]:
        return {"action": f"<action>{runtime.context.env.legal_actions()[0]}</action>"}

    async def reflect(state: dict[str, Any], runtime: Any) -> dict[str, Any]:
        return {"memory": [f"saw {state['history'][-1]['initial_observation']}"]}

    options = GraphOptions(
        num_episodes=3, context="reflection", layout="rerendered", stop_on_success=False
    )
    return build_meta_episode_graph(options, nodes={"play": play, "reflect": reflect})


def start(observation: str, first: bool = True) -> dict[str, Any]:
    msg: dict[str, Any] = {"kind": "start", "observation": observation,
                           "legal_actions": ["GO", "STOP"]}  # fmt: skip
    if first:
        msg["game"] = {"name": "echo", "task_description": "Say GO."}
    return msg


def step(observation: str, done: bool) -> dict[str, Any]:
    msg: dict[str, Any] = {"kind": "result", "observation": observation,
                           "result": {"reward": 1.0 if done else 0.0, "done": done,
                                      "outcome": "won" if done else None}}  # fmt: skip
    if not done:
        msg["legal_actions"] = ["GO", "STOP"]
    return msg


@pytest.fixture()
def session_server(tiny_engine: LocalEngine, tmp_path: Path):
    def make(**limits: Any):
        chat = runtime.chat_model(tiny_engine, temperature=1.0)
        sessions = AgentSessions(remembering_graph(), lambda **_: chat, name="echo",
                                 state_dir=tmp_path / "sessions", **limits)  # fmt: skip
        return serve_in_thread(create_app(tiny_engine, "tiny", agent=sessions))

    return make


@pytest.fixture(scope="module")
def tiny_engine():
    model, tokenizer = load_model("tiny", dtype="fp32")
    with LocalEngine(model, tokenizer, name="tiny") as engine:
        yield engine


async def _play_session(client: openai.AsyncOpenAI, i: int) -> list[str]:
    session: dict[str, Any] = {}

    async def ask(message: dict[str, Any]) -> dict[str, Any]:
        reply = await client.chat.completions.create(
            model="echo", user=f"s{i}", messages=[{"role": "user", "content": "-"}],
            extra_body={"env": message, **session},
        )  # fmt: skip
        session["session"] = reply.model_extra["mage"]["session"]
        return reply.model_extra["mage"]

    for k in range(3):
        await ask(start(f"session {i} episode {k}", first=k == 0))
        await ask(step(f"session {i} episode {k} step 1", False))
        extra = await ask(step("end", True))
    assert extra["meta_done"]
    return extra["reflections"]


def test_sixteen_sessions_keep_their_own_memories(session_server) -> None:
    with session_server(max_sessions=16) as url:

        async def run() -> list[list[str]]:
            client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
            try:
                return await asyncio.gather(*(_play_session(client, i) for i in range(16)))
            finally:
                await client.close()

        memories = asyncio.run(run())
    for i, memory in enumerate(memories):
        assert memory == [f"saw session {i} episode 0", f"saw session {i} episode 1"]


def test_expired_session_and_session_limit_are_refused(session_server) -> None:
    with session_server(max_sessions=2, idle_s=0.5) as url:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)

        def ask(message: dict[str, Any], session: str | None = None) -> Any:
            return client.chat.completions.create(
                model="echo", user="label", messages=[{"role": "user", "content": "-"}],
                extra_body={"env": message, "session": session},
            )  # fmt: skip

        first = ask(start("first"))
        assert first.choices[0].message.content == "<action>GO</action>"
        a = first.model_extra["mage"]["session"]
        ask(start("second"))
        with pytest.raises(openai.RateLimitError, match="limit"):
            ask(start("third"))
        # the result of an action comes before the next start
        with pytest.raises(openai.BadRequestError, match="waits for a result message"):
            ask(start("again", first=False), a)
        time.sleep(0.8)  # both sessions idle past 0.5 s
        with pytest.raises(openai.APIStatusError, match="expired") as refused:
            ask(step("late", False), a)
        assert refused.value.status_code == 410
        # their places are free again
        assert ask(start("new game")).model_extra["mage"]["episode"] == 0
        # a later message without its session's handle starts nothing
        with pytest.raises(openai.BadRequestError, match="starts with a start message"):
            ask(step("where?", False))


def test_mage_serve_agent_command_serves_the_run(planner_run: Path) -> None:
    """`mage serve RUN --agent` as a user types it: a real process, the agent under the
    run folder's name beside the plain model, a game played over HTTP, streaming too."""
    import subprocess
    import sys

    from mage_rl.net import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "mage_rl.cli", "serve", str(planner_run), "--agent",
           "--port", str(port), "--session-idle", "60"]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until_serving(process, f"http://127.0.0.1:{port}",
                           lambda: process.stderr.read().decode())  # fmt: skip
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0)  # fmt: skip
        ids = [c.id for c in client.models.list().data]
        assert ids == ["planner_run", str(planner_run)]
        task = {"seed": 5, "opponent": "kuhn:aggressive", "seat": 1}
        played = play_over_http(client, "planner_run", task, 3, "cli-game")
        assert (planner_run / "sessions").is_dir()  # where a restarted server finds them
        assert len(played["rewards"]) == 3
        # a streamed request gets the whole answer in one chunk, with the agent's calls
        env = make_env("kuhn_poker", "kuhn:aggressive", seat=0)
        chunks = list(client.chat.completions.create(
            model="planner_run", user="streamed", stream=True,
            messages=[{"role": "user", "content": "-"}],
            extra_body={"env": start_message(env, env.reset(1), first=True)},
        ))  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        extras = [c.model_extra["mage"] for c in chunks if (c.model_extra or {}).get("mage")]
        assert len(extras) == 1 and extras[0]["calls"][-1]["kind"] == "play"
        assert text == extras[0]["calls"][-1]["text"]  # the act call's answer is the action
        # a plain-model request still works on the same server
        plain = client.chat.completions.create(
            model=str(planner_run), messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert plain.choices[0].message.content is not None
    finally:
        process.terminate()
        process.wait(60)


# -- restarts --------------------------------------------------------------------------


def _serve(run: Path, port: int, state_dir: Path) -> Any:
    """`mage serve RUN --agent` as a process, once it answers /health."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "mage_rl.cli", "serve", str(run), "--agent", "--port",
           str(port), "--state-dir", str(state_dir)]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_until_serving(process, f"http://127.0.0.1:{port}",
                       lambda: process.stderr.read().decode())  # fmt: skip
    return process


def test_sessions_survive_kill_9_at_three_moments(planner_run: Path, tmp_path: Path) -> None:
    """The server is killed (SIGKILL) after a session's first answer, between two
    episodes, and while a request is in flight; each time a new server starts on the same
    state directory and the client sends its next message (or the one in flight, again).
    The game ends with the same calls and rewards as the same game played unbroken."""
    import signal
    import threading

    from mage_rl.net import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    task = {"seed": 11, "opponent": "kuhn:aggressive", "seat": 0}
    process = _serve(planner_run, port, tmp_path / "state")
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        unbroken = play_over_http(client, "planner_run", task, 3, "unbroken")
        # The same game again, from a client that sends a message again when the server
        # dropped it (the openai SDK does so too, with too short a patience for a restart).
        patient = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        moments: list[str] = []
        sent = {"n": 0}

        def restart(moment: str) -> None:
            nonlocal process
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            process = _serve(planner_run, port, tmp_path / "state")
            moments.append(moment)

        original = patient.chat.completions.create

        def create(**kwargs: Any) -> Any:
            n = sent["n"]
            sent["n"] += 1
            env = kwargs["extra_body"]["env"]
            if n == 1:
                restart("after the first answer")
            elif env["kind"] == "start" and len(moments) == 1:
                restart("between two episodes")
            elif env["kind"] == "result" and env["result"]["done"] and len(moments) == 2:
                # The end of the second episode: the agent reflects, the kill comes
                # while it does.
                killer = threading.Timer(0.03, restart, args=("in flight",))
                killer.start()
                try:
                    return original(**kwargs)
                except openai.APIConnectionError:
                    moments.append("dropped")
                    killer.join()  # the new server is up: the same message again
                    return original(**kwargs)
                finally:
                    killer.join()
            return original(**kwargs)

        patient.chat.completions.create = create  # type: ignore[method-assign]
        broken = play_over_http(patient, "planner_run", task, 3, "broken")
        assert moments[:2] == ["after the first answer", "between two episodes"]
        assert "in flight" in moments and "dropped" in moments, moments  # the kill cut it
        assert broken["calls"] == unbroken["calls"]
        assert broken["rewards"] == unbroken["rewards"]
        assert broken["reflections"] == unbroken["reflections"]
    finally:
        process.kill()
        process.wait(30)
