"""Plugins: user code outside the package registers an environment, opponents and an
agent, and every ``mage`` command sees them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config
from mage_rl.plugins import PluginError, load_entry_point_plugins, load_plugin

# One file that brings all three: a TextEnv (no OpenSpiel) with two variants, a Kuhn
# Poker opponent, and an agent graph that calls the model twice per step.
PLUGIN = '''
from typing import TypedDict
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from mage_rl.envs import Opponent, StepInfo, StepResult, TextEnv, register_env
from mage_rl.envs import register_opponent, register_opponent_factory, register_population
from mage_rl.envs.parsing import extract_action
from mage_rl.graphs import register_agent


class Door(Opponent):
    def __init__(self, doors):
        self.doors, self.spec = doors, f"doors:pick:{doors}"

    def act(self, state, player):
        raise RuntimeError("a task variant plays no moves")


class DoorsEnv(TextEnv):
    """Guess the winning door; the same door wins every episode of a meta-episode."""

    name, seat, invalid_penalty, length_penalty = "doors", 0, 0.5, 1.0

    def __init__(self, variant, max_turns=None):
        self.doors = variant.doors if isinstance(variant, Door) else int(variant.split(":")[-1])
        self.max_turns = max_turns or 2
        self.turns, self.prize = 0, 0

    def reset(self, seed):
        self.turns, self.prize = 0, 1 + seed % self.doors
        return self.initial_observation

    def step(self, response):
        self.turns += 1
        text = (extract_action(response) or "").strip()
        if text not in self.legal_actions():
            info = StepInfo(invalid=True, invalid_reason="name a door number")
            done = self.turns >= self.max_turns
            if done:
                info.outcome = "unfinished"
            return StepResult("Pick again.", 0.0, done, info)
        won = int(text) == self.prize
        info = StepInfo(action=text, outcome="won" if won else "lost", events=[f"door {text}"])
        return StepResult("Done.", 10.0 if won else -10.0, True, info)

    def legal_actions(self):
        return [str(i) for i in range(1, self.doors + 1)]

    @property
    def task_description(self):
        return f"Pick one of {self.doors} doors: <action>N</action>."

    @property
    def initial_observation(self):
        return "Which door?"

    @property
    def transcript(self):
        return []


register_env("doors", factory=lambda v, seat, max_turns: DoorsEnv(v, max_turns), seats=1)
register_opponent_factory("doors", "pick", lambda args: Door(int(args[0])), "doors:pick:N")
register_population("doors_train", "doors:pick:2=1,doors:pick:3=1")
register_population("doors_unseen", "doors:pick:4=1")
register_opponent("kuhn", "stubborn", lambda state, player: 1)


class S(TypedDict, total=False):
    messages: list
    action: str


async def think(state, runtime):
    note = HumanMessage("Think first.")
    reply = await runtime.context.llm.ainvoke([*state["messages"], note], max_tokens=4)
    return {"messages": [*state["messages"], note, reply]}


async def answer(state, runtime):
    reply = await runtime.context.llm.ainvoke(state["messages"], max_tokens=8)
    return {"action": reply.content}


g = StateGraph(S)
g.add_node("think", think)
g.add_node("answer", answer)
g.add_edge(START, "think")
g.add_edge("think", "answer")
g.add_edge("answer", END)
register_agent("thinker", g.compile())
'''

CONFIG = """
env: {name: doors, population: doors_train, seat: first}
meta: {agent: thinker, episodes: 2, context: history}
policy: {model: tiny, dtype: fp32, max_tokens: 8}
rollout: {tasks: 2, group_size: 2}
learner: {dtype: fp32}
eval: {tasks: 2}
train: {iterations: 2}
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("outside")
    (folder / "my_plugin.py").write_text(PLUGIN)
    (folder / "doors.yaml").write_text(CONFIG)
    return folder


def test_plugin_trains_evaluates_and_reaches_the_oracle(plugin_dir: Path, capsys) -> None:
    plugin = str(plugin_dir / "my_plugin.py")
    run_dir = plugin_dir / "run"
    # The real command line in a fresh process, run from outside the repository.
    cmd = [sys.executable, "-m", "mage_rl.cli", "--plugin", plugin, "train",
           str(plugin_dir / "doors.yaml"), "--run-dir", str(run_dir), "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=plugin_dir, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics if "charts/success@1" in m] == [1, 2]
    assert (run_dir / "checkpoints" / "iter_000002" / "model" / "config.json").exists()
    records = [
        json.loads(x) for x in (run_dir / "eval" / "iter_000002.jsonl").read_text().splitlines()
    ]
    nodes = {t["node"] for r in records for t in r["turns"]}
    assert {"think", "answer"} <= nodes

    checkpoint = run_dir / "checkpoints" / "iter_000002" / "model"
    out = plugin_dir / "eval"
    code = main(["--plugin", plugin, "eval", "--agent", f"thinker={checkpoint}",
                 "--agent", "react=tiny", "--env", "doors", "--opponents", "unseen",
                 "--n", "2", "--max-tokens", "8", "--out", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert "doors" in json.dumps(results) and "thinker" in json.dumps(results)

    capsys.readouterr()
    assert main(["--plugin", plugin, "oracle", "kuhn", "--population", "stubborn=1", "--json"]) == 0
    oracle = json.loads(capsys.readouterr().out)
    assert list(oracle["population"]) == ["kuhn_poker:stubborn"]


def test_config_plugins_are_read_from_the_config_folder(plugin_dir: Path) -> None:
    config = plugin_dir / "with_plugins.yaml"
    config.write_text("plugins: [my_plugin.py]\n" + CONFIG)
    cfg = load_config(config, cls=TrainConfig)
    assert cfg.env.name == "doors" and cfg.meta.agent == "thinker"
    assert cfg.plugins == [str(plugin_dir / "my_plugin.py")]  # absolute: run folders keep it
    # The task's constants fill what the config leaves out (SPEC §3).
    assert (cfg.returns.invalid_penalty, cfg.returns.length_penalty) == (0.5, 2.0)


def test_unknown_names_say_how_to_load_a_plugin(tmp_path: Path, capsys) -> None:
    with pytest.raises(ValueError, match=r"unknown environment 'chess'.*--plugin"):
        load_config(None, ["env.name=chess"])
    with pytest.raises(ValueError, match=r"unknown agent 'planner2'.*registered: mage"):
        load_config(None, ["meta.agent=planner2"])
    assert main(["opponents", "kuhn"]) == 0
    assert main(["--plugin", str(tmp_path / "missing.py"), "opponents"]) == 2
    assert "nosuchfile" in "".join(capsys.readouterr().out.split())  # rich wraps lines


def test_a_failing_plugin_is_reported_with_its_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "broken_plugin.py"
    bad.write_text("import math\n\ndef f():\n    return 1 / 0\n\nf()\n")
    with pytest.raises(PluginError, match=r"(?s)broken_plugin\.py.*line 4.*ZeroDivisionError"):
        load_plugin(str(bad))
    with pytest.raises(PluginError, match="no module named 'not_a_module_xyz'"):
        load_plugin("not_a_module_xyz")


def test_entry_point_plugins_load(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ep_plugin_mod.py").write_text(
        "from mage_rl.envs import register_opponent\n"
        "def setup():\n"
        "    register_opponent('kuhn', 'ep_passer', lambda state, player: 0)\n"
    )
    dist = tmp_path / "ep_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[mage_rl.plugins]\npasser = ep_plugin_mod:setup\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "passer" in load_entry_point_plugins()
    from mage_rl.envs import make_opponent

    assert make_opponent("kuhn:ep_passer").spec == "kuhn_poker:ep_passer"
    assert load_entry_point_plugins() == []  # once per process


def test_plugins_reach_child_processes(plugin_dir: Path) -> None:
    from mage_rl.plugins import ENV_VAR, export_plugins

    old = os.environ.get(ENV_VAR)
    try:
        export_plugins([str(plugin_dir / "my_plugin.py")])
        code = textwrap.dedent(
            """
            from mage_rl.plugins import load_process_plugins
            load_process_plugins()
            from mage_rl.envs import env_names
            print(",".join(env_names()))
            """
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert "doors" in out.stdout.strip().split(","), out.stderr
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old


def test_a_commands_plugins_do_not_outlive_it(tmp_path, monkeypatch) -> None:
    """--plugin reaches the command's child processes through the environment, and a
    later command of the same process (the Python API, a test) starts without it."""
    from mage_rl.plugins import ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    plugin = tmp_path / "nothing.py"
    plugin.write_text("VALUE = 1\n")
    assert main(["--plugin", str(plugin), "opponents"]) == 0
    assert ENV_VAR not in os.environ
    monkeypatch.setenv(ENV_VAR, "/kept/by/the/parent.py")
    assert main(["--plugin", str(plugin), "opponents"]) == 0
    assert os.environ[ENV_VAR] == "/kept/by/the/parent.py"
