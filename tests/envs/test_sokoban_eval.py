"""`mage eval` on Sokoban with the tiny model: ReAct and Reflexion on the same rooms,
the training variant and the unseen ones, and the training configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl import cli
from mage_rl.config import TrainConfig, load_config
from mage_rl.envs import episode_seed, make_env
from mage_rl.eval.harness import records_path

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# Small enough for the default suite: 2 rooms x K=2 episodes of at most 3 turns.
FAST = ["--model", "tiny", "--n", "2", "--episodes", "2", "--max-turns", "3", "--max-tokens", "8"]
FAST += ["--dtype", "fp32", "--no-progress"]


def mage(argv: list[str]) -> int:
    """The real `mage` entry point."""
    return cli.main(argv)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "sokoban"
    argv = ["eval", "--agent", "react", "--agent", "reflexion", "--env", "sokoban"]
    # --seat second would be wrong for a one-seat task; the harness uses seat first.
    assert mage([*argv, *FAST, "--seat", "sampled", "--out", str(out)]) == 0
    return out


def test_eval_runs_react_and_reflexion_on_sokoban(run_dir: Path) -> None:
    results = json.loads((run_dir / "results.json").read_text())
    for agent in ("react", "reflexion"):
        cell = results["results"][agent]["sokoban"]
        assert cell["n"] == 2 and cell["complete"]
        assert len(cell["success@k"]) == 2
        assert list(cell["by_opponent"]) == ["sokoban:boxes:2"]
        assert list(cell["by_seat"]) == ["first"]
    table = (run_dir / "table.md").read_text()
    assert "| Method | Sokoban |" in table
    assert sorted(p.name for p in (run_dir / "plots").glob("*.png")) == [
        "success_at_k_sokoban.png",
        "success_at_k_sokoban_by_opponent.png",
    ]


def test_agents_met_the_same_rooms(run_dir: Path) -> None:
    tasks = json.loads((run_dir / "tasks.json").read_text())["sokoban"]["tasks"]
    assert {t["opponent"] for t in tasks} == {"sokoban:boxes:2"}
    assert {t["seat"] for t in tasks} == {0}
    rooms = {}
    for agent in ("react", "reflexion"):
        records = read_lines(records_path(run_dir, agent, "sokoban"))
        rooms[agent] = {r["seed"]: r["turns"][0]["anchor"] for r in records}
        for record in records:
            plays = [t for t in record["turns"] if t["kind"] == "play"]
            # Every turn is judged, and an unsolved episode lasts all its turns.
            assert all(t["invalid"] or not t["invalid_reason"] for t in plays)
            for episode in record["episodes"]:
                assert episode["outcome"] in ("won", "unfinished")
                if episode["outcome"] == "unfinished":
                    assert episode["turns"] == 3
    assert rooms["react"] == rooms["reflexion"]
    # The room each task shows is the one its seed fixes (replay protocol).
    env = make_env("sokoban", "sokoban:boxes:2")
    for seed, anchor in rooms["react"].items():
        assert env.reset(episode_seed(seed, 0, "replay")) == anchor


def test_unseen_variants_are_evaluated_by_box_count(tmp_path: Path) -> None:
    out = tmp_path / "unseen"
    argv = ["eval", "--agent", "react", "--env", "sokoban", "--opponents", "unseen"]
    fast = list(FAST)
    fast[fast.index("--n") + 1] = "4"
    fast[fast.index("--episodes") + 1] = "1"
    fast[fast.index("--max-turns") + 1] = "1"
    assert mage([*argv, *fast, "--out", str(out)]) == 0
    tasks = json.loads((out / "tasks.json").read_text())["sokoban"]
    assert [m[0] for m in tasks["population"]] == ["sokoban:boxes:1", "sokoban:boxes:3"]
    records = read_lines(records_path(out, "react", "sokoban"))
    for record in records:
        boxes = int(record["opponent"].rsplit(":", 1)[1])
        assert record["turns"][0]["anchor"].split(";")[1].count("(") == boxes


@pytest.mark.parametrize("name", ["sokoban_tiny.yaml", "sokoban_smollm2.yaml"])
def test_sokoban_configs_load(name: str) -> None:
    cfg = load_config(CONFIGS / name, cls=TrainConfig)
    assert cfg.env.name == "sokoban" and cfg.env.seat == "first"
    assert cfg.env.population == "sokoban_train"
    assert cfg.returns.invalid_penalty == 0.5 and cfg.returns.length_penalty == 1.0
    assert cfg.returns.gamma_traj == 0.9
