"""``league:``: snapshots of the policy join the training opponents, and survive --resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl import runtime  # noqa: F401  (the model half of GAME:llm:... opponents)
from mage_rl.envs import Population
from mage_rl.rl.league import League, LeagueSection, Member

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


def test_weights_split_the_share_uniformly_or_by_how_often_the_agent_loses(tmp_path: Path) -> None:
    base = Population.parse("kuhn:aggressive=1,kuhn:conservative=3", game="kuhn_poker")
    league = League(tmp_path, "kuhn_poker", LeagueSection(every=1, share=0.4), 0)
    assert league.population(base) == "kuhn_poker:aggressive=0.25,kuhn_poker:conservative=0.75"
    league.members = [Member(1, "/a", 0.9), Member(2, "/b", 0.1), Member(3, "/c", None)]
    assert league.weights() == pytest.approx([1 / 3] * 3)
    mixed = Population.parse(league.population(base), game="kuhn_poker")
    assert dict(zip(mixed.specs, mixed.weights, strict=True)) == pytest.approx(
        {
            "kuhn_poker:aggressive": 0.15,
            "kuhn_poker:conservative": 0.45,
            "kuhn_poker:llm:/a": 0.4 / 3,
            "kuhn_poker:llm:/b": 0.4 / 3,
            "kuhn_poker:llm:/c": 0.4 / 3,
        }
    )
    league.settings = LeagueSection(every=1, weighting="prioritized")
    raw = [0.05, 0.81, 0.25]  # (1 - w)^2 with a floor of 0.05; 0.5 before any game
    assert league.weights() == pytest.approx([r / sum(raw) for r in raw])


def test_a_league_run_adds_samples_and_restores_its_snapshots(tmp_path: Path) -> None:
    from mage_rl.cli import main

    run = tmp_path / "run"
    args = ["train", str(CONFIG), "--run-dir", str(run), "--no-progress",
            "--set", "rollout.tasks=2", "--set", "rollout.group_size=2", "--set", "eval.tasks=0",
            "--set", "league.every=1", "--set", "league.size=2", "--set", "league.share=0.5",
            "--set", "meta.prompt=compact"]  # fmt: skip
    assert main([*args, "--set", "train.iterations=4"]) == 0
    saved = json.loads((run / "league.json").read_text())["members"]
    # Snapshots after iterations 1, 2 and 3 (none after the last); the size bound of 2
    # evicted the first, folder and all.
    assert [m["iteration"] for m in saved] == [2, 3]
    assert not (run / "league" / "checkpoints" / "iter_000001").exists()
    assert all((Path(m["path"]) / "config.json").is_file() for m in saved)
    # A member plays in the run's own format, read from the league's copy of its config.
    from mage_rl.players.played_config import played_config

    member = played_config(saved[0]["path"], None, None, [])
    assert member.meta.prompt == "compact" and member.policy.model == saved[0]["path"]
    assert all(m["win_rate"] is not None for m in saved[:1])  # played in the batch after
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    played = [{k.split("/")[2] for k in row if k.startswith("charts/opponent/llm")} for row in rows]
    assert not played[0] and played[1] and played[3]  # the league joins after iteration 1
    # --resume keeps the league of the checkpoint it resumes from (iteration 4, the last:
    # no snapshot of it), and plays it.
    assert main([*args, "--set", "train.iterations=6", "--resume"]) == 0
    resumed = json.loads((run / "league.json").read_text())["members"]
    assert [m["iteration"] for m in resumed] == [3, 5]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert any(k.startswith("charts/opponent/llm") for k in rows[4])
    # A league read for an earlier start drops the members added after it.
    league = League(run, "kuhn_poker", LeagueSection(every=1, size=2), 4)
    assert [m.iteration for m in league.members] == [3]
