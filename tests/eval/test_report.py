"""`mage report`: tables and plots rebuilt from hand-made run folders, across runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mage_rl.eval.harness import (
    AgentSpec,
    EvalConfig,
    RecordLog,
    eval_tasks,
    prepare_run_dir,
    records_path,
)
from mage_rl.eval.report import collect_run, fmt_mean, fmt_rate, render_markdown, write_report
from mage_rl.records import EpisodeResult, MetaEpisodeRecord, Turn


def mage(argv: list[str]) -> int:
    """The real `mage` entry point."""
    from mage_rl import cli

    return cli.main(argv)


AGENTS = [AgentSpec("react", "react", "tiny"), AgentSpec("reflexion", "reflexion", "tiny")]
# Per agent, the outcomes of the four task instances (stop_on_success, K = 3).
SCRIPT = {
    "react": [
        ["lost", "lost", "lost"],
        ["won"],
        ["lost", "lost", "lost"],
        ["draw", "lost", "lost"],
    ],
    "reflexion": [["won"], ["lost", "won"], ["lost", "lost", "won"], ["lost", "lost", "lost"]],
}
PAYOFF = {"won": 1.0, "lost": -1.0, "draw": 0.0}


def make_run(path: Path, envs=("kuhn_poker",), scripts=SCRIPT, drop_last: bool = False) -> Path:
    """A run folder with hand-written records instead of played ones."""
    cfg = EvalConfig(agents=AGENTS, envs=list(envs), n=4, episodes=3)
    tasks = eval_tasks(cfg)
    prepare_run_dir(path, cfg, tasks)
    for agent in AGENTS:
        for env in cfg.envs:
            log = RecordLog(records_path(path, agent.label, env))
            items = list(zip(tasks[env], scripts[agent.label], strict=True))
            for task, outcomes in items[:-1] if drop_last else items:
                chips = env == "kuhn_poker"
                episodes = [
                    EpisodeResult(i, o, PAYOFF[o], PAYOFF[o] if chips else None)
                    for i, o in enumerate(outcomes)
                ]
                turns = [
                    Turn("play", i, 0, text="<action>BET</action>") for i in range(len(outcomes))
                ]
                turns[0].invalid = agent.label == "react"  # react: one invalid turn in each
                log.append(
                    MetaEpisodeRecord(
                        uid=str(task.seed), rollout=0, env=env, seed=task.seed,
                        opponent=task.opponent, seat=task.seat, episodes=episodes, turns=turns,
                        agent=agent.label,
                    )
                )  # fmt: skip
    return path


def test_results_are_recomputed_from_records(tmp_path) -> None:
    run = make_run(tmp_path / "run")
    results = collect_run(run)
    react = results["results"]["react"]["kuhn_poker"]
    reflexion = results["results"]["reflexion"]["kuhn_poker"]
    assert [e["mean"] for e in react["success@k"]] == [0.25, 0.25, 0.25]
    assert [e["mean"] for e in reflexion["success@k"]] == [0.25, 0.5, 0.75]
    assert react["draw@k"][0]["mean"] == 0.25
    # ev@1 over all four first hands; ev@2 only over the meta-episodes not yet won.
    assert react["ev@k"][0]["mean"] == pytest.approx((-1 + 1 - 1 + 0) / 4)
    assert reflexion["ev@k"][1]["n"] == 3
    assert react["turns"]["invalid_share"] == pytest.approx(4 / 10)
    assert results["oracle"]["kuhn_poker"]["second"]["ceiling"] == pytest.approx(0.2667, abs=1e-4)
    assert sum(results["seat_share"]["kuhn_poker"].values()) == pytest.approx(1.0)


def test_report_writes_table_one_plots_and_json(tmp_path) -> None:
    run = make_run(tmp_path / "run", envs=("kuhn_poker", "tic_tac_toe"))
    table = write_report([run])
    text = table.read_text()
    assert "| Method | Kuhn Poker | Tic-Tac-Toe |" in text
    react = collect_run(run)["results"]["react"]
    row = f"| react | {fmt_rate(react['kuhn_poker']['success@k'][-1])} | "
    assert row + f"{fmt_rate(react['tic_tac_toe']['success@k'][-1])} |" in text
    assert "success@3" in text and "invalid share" in text
    assert "+0.0833" in text and "+0.2833" in text  # oracle, agent first: best fixed, ceiling
    assert "Tic-Tac-Toe\n" in text and "ev@1" in text
    assert json.loads((run / "results.json").read_text())["results"].keys() == {
        "react",
        "reflexion",
    }
    names = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert names == [
        "success_at_k_kuhn_poker.png",
        "success_at_k_kuhn_poker_by_opponent.png",
        "success_at_k_tic_tac_toe.png",
        "success_at_k_tic_tac_toe_by_opponent.png",
    ]


def test_unfinished_cells_are_marked(tmp_path) -> None:
    run = make_run(tmp_path / "run", drop_last=True)
    results = collect_run(run)
    assert not results["results"]["react"]["kuhn_poker"]["complete"]
    assert "(3/4)" in render_markdown([results])


def test_report_across_runs(tmp_path, capsys) -> None:
    first = make_run(tmp_path / "a")
    second = make_run(tmp_path / "b", envs=("tic_tac_toe",))
    shutil.rmtree(second / "records" / "react")  # react has not played in run b yet
    out = tmp_path / "both"
    assert mage(["report", str(first), str(second), "--out", str(out)]) == 0
    text = (out / "table.md").read_text()
    # The same label in two runs gets the run's name; each run fills its own column.
    assert "| Method | Kuhn Poker | Tic-Tac-Toe |" in text
    assert "| reflexion (a) | 0.750 [0.30, 0.95] | - |" in text
    assert "| reflexion (b) | - | 0.750 [0.30, 0.95] |" in text
    assert "| react (b) | - | - (0/4) |" in text
    assert len(json.loads((out / "report.json").read_text())["runs"]) == 2
    assert (out / "plots" / "success_at_k_tic_tac_toe.png").exists()
    assert mage(["report", str(first), str(second)]) == 2
    assert "--out" in capsys.readouterr().out


def test_report_from_results_json_alone(tmp_path) -> None:
    run = make_run(tmp_path / "run")
    write_report([run])
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(run / "results.json", copy / "results.json")
    write_report([copy], tmp_path / "out")
    assert "| react |" in (tmp_path / "out" / "table.md").read_text()
    with pytest.raises(FileNotFoundError, match="neither"):
        write_report([tmp_path / "nothing"], tmp_path / "out")


def test_formatting() -> None:
    assert fmt_rate({"mean": 0.375, "low": 0.1368, "high": 0.6943, "n": 8}) == "0.375 [0.14, 0.69]"
    assert fmt_rate({"mean": None, "low": None, "high": None, "n": 0}) == "-"
    assert fmt_mean({"mean": 0.125, "low": -0.31, "high": 0.56, "n": 8}) == "+0.125 [-0.31, +0.56]"
    assert fmt_mean({"mean": -0.5, "low": None, "high": None, "n": 1}) == "-0.500"


def test_report_does_not_import_the_harness() -> None:
    """The report reads run folders; the harness plays and then calls the report. The
    modules below the harness never import it, so the two cannot form a cycle."""
    import ast

    import mage_rl.eval

    folder = Path(mage_rl.eval.__file__).parent
    for name in ("report", "tables", "plots", "eval_folder", "conditions", "agents", "settings"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        assert "mage_rl.eval.harness" not in imported, name
