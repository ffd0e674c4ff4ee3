"""`mage eval` end to end on the tiny model: outputs, identical conditions for every
agent, resumption after an interruption, and the checks on agents and conditions."""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mage_rl import cli
from mage_rl.eval import cli as eval_cli
from mage_rl.eval.harness import (
    AgentSpec,
    EvalConfig,
    RecordLog,
    eval_tasks,
    opponent_population,
    parse_agents,
    prepare_run_dir,
    records_path,
    run_evaluation,
)

# Small enough for the default suite: 4 tasks x K=3, responses of at most 8 tokens.
FAST = ["--model", "tiny", "--n", "4", "--episodes", "3", "--max-tokens", "8", "--dtype", "fp32"]
FAST += ["--no-progress"]


def mage(argv: list[str]) -> int:
    """The real `mage` entry point."""
    return cli.main(argv)


def fast_config(**overrides) -> EvalConfig:
    values = dict(
        agents=[AgentSpec("react", "react", "tiny")], n=4, episodes=3, max_tokens=8, dtype="fp32"
    )  # the conditions of FAST
    values.update(overrides)
    return EvalConfig(**values)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "run"
    argv = ["eval", "--agent", "react", "--agent", "reflexion", "--env", "kuhn_poker"]
    assert mage([*argv, *FAST, "--out", str(out)]) == 0
    return out


def test_eval_writes_results_table_and_plots(run_dir: Path) -> None:
    results = json.loads((run_dir / "results.json").read_text())
    for agent in ("react", "reflexion"):
        cell = results["results"][agent]["kuhn_poker"]
        assert cell["n"] == 4 and cell["complete"]
        assert len(cell["success@k"]) == 3  # success@1..3
        means = [e["mean"] for e in cell["success@k"]]
        assert means == sorted(means)  # Pass@k never decreases in k
        assert all(e["low"] <= e["mean"] <= e["high"] for e in cell["success@k"])
        assert {"by_opponent", "by_seat", "by_opponent_seat", "turns"} <= set(cell)
    assert results["oracle"]["kuhn_poker"]["first"]["best_fixed"] == pytest.approx(1 / 12)
    stamp = results["provenance"]  # what produced the file: mage_rl.provenance
    assert stamp["torch_threads"] >= 1 and stamp["versions"]["torch"] and stamp["cpu_model"]
    assert stamp["commit"] and stamp["wall_seconds"] > 0
    table = (run_dir / "table.md").read_text()
    assert "| Method | Kuhn Poker |" in table
    assert "| react |" in table and "| reflexion |" in table
    assert "best fixed" in table
    # What each agent answered at each state: every play turn of the cell, by card.
    assert "### Answers by decision state" in table
    decisions = results["results"]["react"]["kuhn_poker"]["decisions"]
    assert all(state.startswith("Your card: ") for state in decisions)
    react = read_lines(records_path(run_dir, "react", "kuhn_poker"))
    plays = sum(t["kind"] == "play" for r in react for t in r["turns"])
    assert sum(sum(c.values()) for c in decisions.values()) == plays
    # The same answers by episode, with the same total, and their table.
    by_episode = results["results"]["react"]["kuhn_poker"]["decisions_by_episode"]
    assert "0" in by_episode and sum(sum(c.values()) for c in by_episode.values()) == plays
    assert "The same answers by episode" in table and "| agent | episode 1 |" in table
    pngs = sorted((run_dir / "plots").glob("*.png"))
    assert [p.name for p in pngs] == [
        "success_at_k_kuhn_poker.png",
        "success_at_k_kuhn_poker_by_opponent.png",
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_agents_met_the_same_seeds_opponents_and_deals(run_dir: Path) -> None:
    tasks = json.loads((run_dir / "tasks.json").read_text())["kuhn_poker"]["tasks"]
    expected = {(t["seed"], t["opponent"], t["seat"]) for t in tasks}
    first_observation = {}
    for agent in ("react", "reflexion"):
        records = read_lines(records_path(run_dir, agent, "kuhn_poker"))
        assert {(r["seed"], r["opponent"], r["seat"]) for r in records} == expected
        assert all(r["agent"] == agent for r in records)
        # The first play turn acts on the deal the task seed fixes: the same card.
        first_observation[agent] = {r["seed"]: r["turns"][0]["anchor"] for r in records}
    assert first_observation["react"] == first_observation["reflexion"]
    # ReAct carries nothing across episodes; Reflexion writes reflections between them.
    react = read_lines(records_path(run_dir, "react", "kuhn_poker"))
    assert not any(t["kind"] == "reflect" for r in react for t in r["turns"])
    # Evaluation records keep texts but not token ids.
    assert all(t["response_ids"] == [] and t["text"] for r in react for t in r["turns"])


class Interrupt(Exception):
    pass


def test_resume_after_interruption_skips_finished_meta_episodes(run_dir, tmp_path) -> None:
    cfg = fast_config(concurrency=2)
    out = tmp_path / "run"
    seen: list[int] = []

    def stop_after_two(record) -> None:
        seen.append(record.seed)
        if len(seen) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_evaluation(cfg, out, progress=False, on_record=stop_after_two)
    path = records_path(out, "react", "kuhn_poker")
    saved = path.read_text().splitlines()
    assert 2 <= len(saved) < 4
    replayed: list[int] = []
    results = run_evaluation(cfg, out, progress=False, on_record=lambda r: replayed.append(r.seed))
    # Only the missing meta-episodes were played; the saved lines were left as they were.
    assert len(replayed) == 4 - len(saved)
    assert not set(replayed) & {json.loads(line)["seed"] for line in saved}
    lines = path.read_text().splitlines()
    assert lines[: len(saved)] == saved
    assert sorted(json.loads(line)["seed"] for line in lines) == sorted(
        t.seed for t in eval_tasks(cfg)["kuhn_poker"]
    )
    assert results["results"]["react"]["kuhn_poker"]["complete"]

    # Per-call sampling seeds: the resumed run played what an uninterrupted one did.
    def texts(p: Path) -> dict[int, list[str]]:
        return {r["seed"]: [t["text"] for t in r["turns"]] for r in read_lines(p)}

    assert texts(path) == texts(records_path(run_dir, "react", "kuhn_poker"))
    # A finished run has nothing left to do.
    again: list[int] = []
    run_evaluation(cfg, out, progress=False, on_record=lambda r: again.append(r.seed))
    assert again == []


def test_a_torn_last_line_is_dropped_and_replayed(run_dir, tmp_path) -> None:
    lines = records_path(run_dir, "react", "kuhn_poker").read_text().splitlines()
    path = tmp_path / "r.jsonl"
    path.write_text(lines[0] + "\n" + lines[1] + "\n" + lines[2][:50])
    records = RecordLog(path).read()
    assert len(records) == 2
    assert path.read_text().count("\n") == 2  # rewritten without the torn line
    path.write_text(lines[0][:50] + "\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:1"):
        RecordLog(path).read()


def test_other_conditions_refuse_to_resume(tmp_path) -> None:
    cfg = fast_config()
    prepare_run_dir(tmp_path, cfg, eval_tasks(cfg))
    changed = fast_config(n=5, temperature=1.0)
    with pytest.raises(ValueError, match=r"n: 4 -> 5; temperature: 0.7 -> 1.0"):
        prepare_run_dir(tmp_path, changed, eval_tasks(changed))


def test_agents_can_join_a_run_but_not_change(tmp_path) -> None:
    cfg = fast_config()
    prepare_run_dir(tmp_path, cfg, eval_tasks(cfg))
    more = fast_config(agents=[AgentSpec("reflexion", "reflexion", "tiny")], concurrency=3)
    agents = prepare_run_dir(tmp_path, more, eval_tasks(more))
    assert [a.label for a in agents] == ["react", "reflexion"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert [a["label"] for a in saved["agents"]] == ["react", "reflexion"]
    other = fast_config(agents=[AgentSpec("react", "reflexion", "tiny")])
    with pytest.raises(ValueError, match="already has agent 'react'"):
        prepare_run_dir(tmp_path, other, eval_tasks(other))


def test_parse_agents() -> None:
    agents = parse_agents(["react", "reflexion", "mage=tiny"], "smollm2")
    assert agents == [
        AgentSpec("react", "react", "smollm2"),
        AgentSpec("reflexion", "reflexion", "smollm2"),
        AgentSpec("mage", "mage", "tiny"),
    ]
    two = parse_agents(["react", "react=/ckpt/iter_5/model", "react=tiny@small"], "smollm2")
    assert [a.label for a in two] == ["react:smollm2", "react:model", "small"]
    remote = parse_agents(["react=endpoint"], "smollm2", "http://h:8000/v1", "Qwen3-4B")
    assert remote == [AgentSpec("react", "react", "http://h:8000/v1", "Qwen3-4B")]
    with pytest.raises(ValueError, match="unknown agent style 'lamer'"):
        parse_agents(["lamer"], "smollm2")
    with pytest.raises(ValueError, match="--endpoint URL"):
        parse_agents(["react=endpoint"], "smollm2")
    with pytest.raises(ValueError, match="--endpoint-model"):
        parse_agents(["react=http://h:8000/v1"], "smollm2")
    with pytest.raises(ValueError, match="two agents are labelled 'x'"):
        parse_agents(["react@x", "reflexion@x"], "smollm2")
    with pytest.raises(ValueError, match="no agent"):
        parse_agents([], "smollm2")


def test_opponent_sets_by_name() -> None:
    assert opponent_population("train", "kuhn_poker").specs == [
        "kuhn_poker:conservative",
        "kuhn_poker:aggressive",
        "kuhn_poker:intermediate",
    ]
    assert opponent_population("unseen", "kuhn_poker").specs == ["kuhn_poker:cfr"]
    assert opponent_population("unseen", "tic_tac_toe").specs == ["tic_tac_toe:mcts:1000"]
    assert "tic_tac_toe:mcts:100" in opponent_population("train", "tic_tac_toe").specs
    assert opponent_population("aggressive", "kuhn_poker").specs == ["kuhn_poker:aggressive"]
    with pytest.raises(ValueError, match="does not play tic_tac_toe"):
        opponent_population("kuhn_unseen", "tic_tac_toe")


def test_eval_config_checks() -> None:
    cfg = fast_config(envs=["kuhn", "ttt"])
    assert cfg.envs == ["kuhn_poker", "tic_tac_toe"] and cfg.agents[0].play["max_tokens"] == 8
    tasks = eval_tasks(cfg)
    assert [t.seed for t in tasks["kuhn_poker"]] == [t.seed for t in tasks["tic_tac_toe"]]
    with pytest.raises(ValueError, match="top_p=1.5 must be in"):
        fast_config(top_p=1.5)
    with pytest.raises(ValueError, match="does not exist"):
        fast_config(agents=[AgentSpec("mage", "mage", "/no/such/checkpoint")])
    with pytest.raises(ValueError, match="unknown seat"):
        fast_config(seat="middle")
    with pytest.raises(ValueError, match="unknown environment"):
        fast_config(envs=["chess"])


def test_cli_defaults_match_eval_config() -> None:
    parser = argparse.ArgumentParser()
    eval_cli.register(parser.add_subparsers())
    args = parser.parse_args(["eval", "--agent", "react", "--out", "x"])
    defaults = {f.name: f.default for f in dataclasses.fields(EvalConfig)}
    for name, value in defaults.items():
        if name in ("agents", "envs"):
            continue
        assert getattr(args, name) == value, name
    assert args.model == "smollm2" and args.envs == []


def test_every_setting_is_a_flag_with_its_help() -> None:
    from mage_rl.eval.settings import EvalSettings

    parser = argparse.ArgumentParser()
    eval_cli.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices["eval"]._actions}
    for f in dataclasses.fields(EvalSettings):
        assert actions[f.name].help == f.metadata["help"], f.name
    assert actions["episodes"].option_strings == ["--episodes", "-k"]
    assert actions["envs"].option_strings == ["--env"]


def test_settings_that_are_run_config_keys_take_its_choices_and_defaults() -> None:
    """The flags of how an agent plays are the run config's keys: the same choices, and
    an agent without a run plays the run config's defaults."""
    from mage_rl.config import RunConfig
    from mage_rl.eval.settings import EvalSettings
    from mage_rl.players.play_settings import PLAY_KEYS, get_path, play_defaults

    parser = argparse.ArgumentParser()
    eval_cli.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices["eval"]._actions}
    assert actions["layout"].choices == ("rerendered", "conversation")
    assert actions["protocol"].choices == ("replay", "fresh")
    assert actions["dtype"].choices == ("auto", "bf16", "fp32")
    assert "as meta.layout (default: the run's, else rerendered)" in actions["layout"].help
    assert "else off" in actions["constrain_actions"].help
    assert "else 96" in actions["max_tokens"].help
    defaults = RunConfig().model_dump(mode="json")
    for style, context in (("mage", "reflection"), ("react", "none")):
        play = play_defaults(style)
        for name, key in PLAY_KEYS.items():
            if name not in ("agent", "context"):
                assert play[name] == get_path(defaults, key), name
        assert (play["agent"], play["context"]) == (style, context)
    assert {f.name for f in dataclasses.fields(EvalSettings)} >= set(PLAY_KEYS) - {
        "agent", "plugins", "engine"
    }


def test_cli_errors_are_messages(tmp_path, capsys) -> None:
    code = mage(
        ["eval", "--agent", "react", "--opponents", "nobody", *FAST, "--out", str(tmp_path)]
    )
    assert code == 2
    assert "nobody" in capsys.readouterr().out


# -- an OpenAI-compatible endpoint ---------------------------------------------------------


class _FakeEndpoint(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "<action>BET</action>"},
                    "finish_reason": "stop",
                }
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FakeEndpoint.bodies = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        thread.join()


def test_endpoint_agent_gets_the_same_sampling_settings(endpoint, tmp_path) -> None:
    argv = ["eval", "--agent", "react=endpoint", "--endpoint", endpoint]
    argv += ["--endpoint-model", "served", "--n", "3", "--no-stop-on-success"]
    assert mage([*argv, "--max-tokens", "40", "--no-progress", "--out", str(tmp_path)]) == 0
    bodies = _FakeEndpoint.bodies
    assert bodies and all(b["model"] == "served" for b in bodies)
    assert {(b["temperature"], b["top_p"], b["top_k"], b["max_tokens"]) for b in bodies} == {
        (0.7, 0.8, 20, 40)
    }
    assert len({b["seed"] for b in bodies}) == len(bodies)  # a fresh seed per call
    records = read_lines(records_path(tmp_path, "react", "kuhn_poker"))
    assert len(records) == 3 and all(len(r["episodes"]) == 3 for r in records)
    assert not any(t["invalid"] for r in records for t in r["turns"])  # BET is always legal
