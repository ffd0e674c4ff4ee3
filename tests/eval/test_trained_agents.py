"""``mage eval --agent NAME=RUN_DIR`` plays a trained agent exactly as it was trained.

A plugin agent (its own ``note`` node, a call through the conversation before each
move) is trained with ``--plugin``, the conversation layout, constrained decoding and
non-default token limits; a fresh process, started elsewhere and given no plugin,
evaluates the run folder in that format, and a flag that overrides it is listed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mage_rl.cli import main
from mage_rl.eval.agents import parse_agents
from mage_rl.plugins import ENV_VAR
from mage_rl.train_folder import find_run

AGENT = """
from mage_rl.graphs import build_meta_episode_graph, register_agent
from mage_rl.nodes.conversation import conversation_call
from mage_rl.nodes.core import play_prompt


async def note(state, runtime):
    ctx = runtime.context
    ask = {"role": "user", "content": "Note in three words what you expect."}
    first = [*play_prompt(state, ctx), ask]
    _, conversation = await conversation_call(state, ctx, first, ask, 4, "\\n")
    return {"conversation": conversation}


register_agent("noter", lambda options: build_meta_episode_graph(
    options, before={"play": ("note", note)}, name="noter"))
"""

CONFIG = """
env: {name: rps, population: rps_train}
meta: {agent: noter, episodes: 2, context: history, layout: conversation, stop_on_success: false}
policy: {model: tiny, dtype: fp32, max_tokens: 12, constrain_actions: true}
rollout: {tasks: 2, group_size: 2}
learner: {dtype: fp32}
eval: {tasks: 0}
train: {iterations: 1}
"""

TRAINED_PLAY = {
    "agent": "noter",
    "dtype": "fp32",
    "layout": "conversation",
    "context": "history",
    "constrain_actions": True,
    "max_tokens": 12,
    "stop_on_success": False,
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run trained with ``--plugin`` (the config names no plugin)."""
    folder = tmp_path_factory.mktemp("trained")
    (folder / "noter.py").write_text(AGENT)
    (folder / "noter.yaml").write_text(CONFIG)
    run = folder / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_VAR, "")  # main() exports --plugin here; put it back afterwards
        code = main(["--plugin", str(folder / "noter.py"), "train", str(folder / "noter.yaml"),
                     "--run-dir", str(run), "--no-progress"])  # fmt: skip
    assert code == 0
    return run


def test_the_run_folder_records_plugins_given_on_the_command_line(trained: Path) -> None:
    saved = yaml.safe_load((trained / "config.yaml").read_text())
    assert saved["plugins"] == [str(trained.parent / "noter.py")]


def test_a_run_is_named_by_its_folder_or_a_checkpoint(trained: Path) -> None:
    checkpoint = trained / "checkpoints" / "iter_000001"
    for name in (trained, checkpoint, checkpoint / "model"):
        assert find_run(str(name)) == (trained, checkpoint / "model")
    assert find_run("tiny") is None and find_run(str(trained.parent)) is None
    # A name that is no agent labels the run's own agent; an agent's name picks its graph.
    mine, other = parse_agents([f"best={trained}", f"reflexion={checkpoint}"], "tiny")
    assert (mine.label, mine.style, mine.run) == ("best", "noter", str(trained))
    assert (other.label, other.style) == ("reflexion", "reflexion")


def test_eval_plays_the_training_format_and_lists_an_override(
    trained: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    # A fresh process in another folder, with no --plugin: the run folder says what it needs.
    cmd = [sys.executable, "-m", "mage_rl.cli", "eval", "--agent", f"noter={trained}",
           "--n", "2", "--out", str(out), "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, ENV_VAR: ""})  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    # The conditions come from the run: its game, its population, its K.
    cond = config["conditions"]
    assert (cond["envs"], cond["opponents"], cond["episodes"]) == (
        ["rock_paper_scissors"],
        "rps_train",
        2,
    )
    (agent,) = config["agents"]
    assert {k: agent["play"][k] for k in TRAINED_PLAY} == TRAINED_PLAY
    assert agent["overridden"] == {}
    lines = (out / "records" / "noter" / "rock_paper_scissors.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2
    for record in records:
        turns = record["turns"]
        assert [t["node"] for t in turns] == ["note", "play"] * 2  # all K episodes played
        assert record["conversation"]["ids"]  # one chat of token ids, as in training
        for turn in turns:
            if turn["node"] == "play":
                choices = {f"<action>{a}</action>" for a in ("ROCK", "PAPER", "SCISSORS")}
                assert turn["text"] in choices and turn["max_response_length"] == 12
            else:
                assert turn["max_response_length"] == 4

    # A flag overrides the run's value; the table says so.
    overridden = tmp_path / "eval_long"
    code = main(["eval", "--agent", f"noter={trained}", "--agent", "mage=tiny",
                 "--max-tokens", "20", "--n", "2", "--out", str(overridden),
                 "--no-progress"])  # fmt: skip
    assert code == 0
    agents = json.loads((overridden / "config.json").read_text())["agents"]
    assert agents[0]["overridden"] == {"max_tokens": 12} and agents[0]["play"]["max_tokens"] == 20
    table = (overridden / "table.md").read_text()
    assert "*20 (run: 12)*" in table
    header = next(line for line in table.splitlines() if line.startswith("| Agent | trained run"))
    for setting in ("layout", "context", "constrain_actions", "max_tokens", "stop_on_success"):
        assert setting in header  # every setting in which the two agents differ

    # Resuming the first folder with another format for the same agent is refused.
    with pytest.raises(ValueError, match="played with other settings"):
        from mage_rl.eval.harness import EvalConfig, run_evaluation

        agents_again = parse_agents([f"noter={trained}"], "tiny")
        run_evaluation(EvalConfig(agents=agents_again, n=2, max_tokens=20), out, progress=False)
