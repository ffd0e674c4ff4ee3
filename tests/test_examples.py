"""The worked examples of docs/extending.md, run as the docs tell a user to run them."""

from __future__ import annotations

import json
from pathlib import Path

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config

EXAMPLES = Path(__file__).parents[1] / "examples" / "extending"


def _train(config: Path, run_dir: Path, *extra: str) -> list[dict]:
    code = main(["train", str(config), "--run-dir", str(run_dir), "--no-progress",
                 "--set", "train.iterations=1", *extra])  # fmt: skip
    assert code == 0
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_planner_agent_trains_from_its_yaml(tmp_path: Path) -> None:
    metrics = _train(EXAMPLES / "planner_kuhn_tiny.yaml", tmp_path / "planner",
                     "--set", "meta.episodes=2", "--set", "eval.tasks=1")  # fmt: skip
    assert metrics[0]["losses/loss"] == metrics[0]["losses/loss"]  # a finite update ran
    records = [json.loads(x) for x in (tmp_path / "planner" / "eval" / "iter_000001.jsonl")
               .read_text().splitlines()]  # fmt: skip
    steps = [(t["node"], t["kind"]) for r in records for t in r["turns"] if t["kind"] != "reflect"]
    assert steps[:2] == [("plan", "call"), ("act", "play")]


def test_pennies_plugin_environment_trains_and_evaluates(tmp_path: Path) -> None:
    _train(EXAMPLES / "pennies_tiny.yaml", tmp_path / "pennies", "--set", "eval.tasks=0")
    out = tmp_path / "eval"
    # As docs/extending.md: the run folder brings its plugin, game, seat and decoding.
    code = main(["eval", "--agent", f"mage={tmp_path / 'pennies'}", "--opponents", "unseen",
                 "--n", "2", "--out", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    records = (out / "records").rglob("*.jsonl")
    turns = [t for f in records for line in f.read_text().splitlines()
             for t in json.loads(line)["turns"] if t["kind"] == "play"]  # fmt: skip
    assert turns and all(t["text"] in {"<action>HEADS</action>", "<action>TAILS</action>"}
                         for t in turns)  # fmt: skip


def test_custom_opponents_in_oracle_eval_and_config(tmp_path: Path, capsys) -> None:
    plugin = str(EXAMPLES / "kuhn_bluffers.py")
    capsys.readouterr()
    assert main(["--plugin", plugin, "oracle", "kuhn", "--population", "always_bet=1",
                 "--json"]) == 0  # fmt: skip
    oracle = json.loads(capsys.readouterr().out)
    first = next(s for s in oracle["seats"] if s["seat"] == "first")
    # Against a player who always bets and calls, the first player's best response is
    # worth 1/3 of a chip per hand: K bets and is called (+2), Q checks and calls the
    # bet (+2 against J, -2 against K: 0), J checks and folds to the bet (-1).
    assert abs(first["best_response"]["kuhn_poker:always_bet"] - 1 / 3) < 1e-9
    out = tmp_path / "eval"
    assert main(["--plugin", plugin, "eval", "--agent", "reflexion=tiny", "--opponents",
                 "bluffers", "--n", "2", "--max-tokens", "8", "--out", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    config = tmp_path / "bluffers.yaml"
    config.write_text(
        f"plugins: [{plugin}]\nenv: {{population: bluffers}}\npolicy: {{model: tiny}}\n"
    )
    cfg = load_config(config, cls=TrainConfig)
    assert cfg.env.population == "bluffers"


def test_rock_paper_scissors_opponents_of_your_own(tmp_path: Path, capsys) -> None:
    plugin = str(EXAMPLES / "rps_reactive.py")
    capsys.readouterr()
    assert main(["--plugin", plugin, "oracle", "rps", "--population", "rps_echoes",
                 "--json"]) == 0  # fmt: skip
    three = json.loads(capsys.readouterr().out)[2]
    # The sore loser always plays ROCK until it loses, so round 1 is won half the time
    # (PAPER beats the sore loser, and the echo's first move is random); from round 3
    # on both are known and every round is won.
    assert three["bayes_by_round"] == [0.5, 0.5, 1.0]
    assert set(three["population"]) == {
        "rock_paper_scissors:echo_two_back",
        "rock_paper_scissors:sore_loser",
    }
    # The echo plays in the game what its model says: the agent's move two rounds back.
    from mage_rl.envs import make_env

    env = make_env("rps", "rps:echo_two_back", seat=0)
    moves = ["PAPER", "SCISSORS", "ROCK", "ROCK"]
    feedback = []
    for t, move in enumerate(moves):
        env.reset(t)
        feedback.append(env.step(f"<action>{move}</action>").info.feedback)
    assert feedback[2].endswith("the opponent played PAPER.")
    assert feedback[3].endswith("the opponent played SCISSORS.")
    out = tmp_path / "eval"
    assert main(["--plugin", plugin, "eval", "--agent", "reflexion=tiny", "--env", "rps",
                 "--opponents", "rps_echoes", "--n", "2", "--max-tokens", "8",
                 "--out", str(out), "--no-progress"]) == 0  # fmt: skip
