"""Where a run's time goes: the phase table, the line per iteration, the cached baselines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.rl.phases import EVAL_BEFORE, LEARNER, OTHER, ROLLOUTS, SETUP, RunClock

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "configs" / "kuhn_tiny.yaml"
OVERRIDES = ["train.iterations=1", "eval.tasks=2", "eval.before=true",
             "eval.baselines=[reflexion]", "train.save_samples=0"]  # fmt: skip


def table_seconds(report: str) -> tuple[dict[str, float], float]:
    """The rows of report.md's phase table (seconds by phase) and its total."""
    section = report.split("## Where the time went", 1)[1]
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| [\d.]+ % \| [^|]+ \|$", section, re.M))
    seconds = {name: float(value) for name, value in rows.items()}
    return seconds, seconds.pop("total")


def test_clock_rows_add_up_to_the_wall_time(tmp_path: Path) -> None:
    clock = RunClock(tmp_path, started=0.0, start_iteration=0, iterations=4)
    clock.elapsed = lambda: 100.0  # type: ignore[method-assign]
    clock.add(SETUP, 10.0)
    clock.add(EVAL_BEFORE + "untrained", 20.0, "cached")
    clock.add(ROLLOUTS, 15.0)
    clock.add(LEARNER, 30.0)
    clock.add(ROLLOUTS, 5.0)
    summary = clock.summary()
    rows = {r["phase"]: r for r in summary["rows"]}
    assert list(rows) == [SETUP, EVAL_BEFORE + "untrained", ROLLOUTS, LEARNER, OTHER]
    assert rows[ROLLOUTS]["seconds"] == 20.0 and rows[OTHER]["seconds"] == 20.0
    assert sum(r["share"] for r in summary["rows"]) == pytest.approx(1.0)
    rows_md = clock.markdown()
    assert any(
        r.startswith("| evaluation before: untrained (cached) | 20.0 | 20.0 % | ") for r in rows_md
    )
    clock.close()


def test_each_phase_keeps_its_memory_peak(tmp_path: Path) -> None:
    """A block held for a while inside one phase raises that phase's peak, not the next
    one's; the session's peak is the highest of all."""
    clock = RunClock(tmp_path, started=0.0, start_iteration=0, iterations=1)
    try:
        clock.add(SETUP, 1.0)
        block = bytearray(300 * 2**20)
        block[::4096] = b"x" * len(range(0, len(block), 4096))  # touch every page
        time.sleep(0.4)  # the sampler reads every 50 ms
        del block
        clock.add(ROLLOUTS, 1.0)
        time.sleep(0.2)
        clock.add(LEARNER, 1.0)
    finally:
        clock.close()
    peaks = clock.session()["phase_peak_rss_mb"]
    assert peaks[ROLLOUTS] - peaks[LEARNER] > 250, peaks
    assert clock.session()["peak_rss_mb"] >= peaks[ROLLOUTS]
    rows = {r["phase"]: r for r in clock.summary()["rows"]}
    assert rows[ROLLOUTS]["peak_rss_mb"] == peaks[ROLLOUTS] and rows[OTHER]["peak_rss_mb"] is None
    assert any(" GiB |" in line for line in clock.markdown())


def test_a_resumed_clock_adds_the_earlier_sessions(tmp_path: Path) -> None:
    first = RunClock(tmp_path, started=0.0, start_iteration=0, iterations=4)
    first.elapsed = lambda: 50.0  # type: ignore[method-assign]
    first.add(LEARNER, 30.0)
    first.save()
    second = RunClock(tmp_path, started=0.0, start_iteration=2, iterations=4)
    second.elapsed = lambda: 40.0  # type: ignore[method-assign]
    second.add(LEARNER, 25.0)
    summary = second.summary()
    assert summary["wall_s"] == 90.0
    assert {r["phase"]: r["seconds"] for r in summary["rows"]}[LEARNER] == 55.0
    assert [s["resumed_from"] for s in summary["sessions"]] == [None, 2]
    assert "2 sessions (resumed from iteration 2)" in "\n".join(second.markdown())
    # A fresh run in the same folder starts its own table.
    assert RunClock(tmp_path, started=0.0, start_iteration=0, iterations=4).earlier == []


def test_the_time_left_counts_the_iterations_left_and_the_last_evaluation(tmp_path) -> None:
    clock = RunClock(tmp_path, started=0.0, start_iteration=0, iterations=5)
    clock.iteration_seconds = [10.0, 20.0]
    assert clock.estimate_left(2) == 45.0
    clock.eval_estimate = 7.0
    assert clock.estimate_left(2) == 52.0 and clock.estimate_left(5) == 7.0


def test_a_run_logs_its_iterations_and_phases_and_its_rerun_reads_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One test (a module fixture would train once per xdist worker): ``mage train`` in a
    subprocess whose output goes to a pipe, as in a redirected log; then the same config
    again in this process, whose evaluations before training come from the cache."""
    first = tmp_path / "first"
    args = [sys.executable, "-m", "mage_rl.cli", "train", str(CONFIG), "--run-dir", str(first)]
    args += [a for o in OVERRIDES for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log

    # The line of the iteration, though the output is not a terminal.
    line = next(x for x in log.splitlines() if "iteration 1/1:" in x)
    assert re.search(r"rollouts [\d.]+ s, learner [\d.]+ s, success .* loss", line), line
    assert re.search(r"elapsed \d+:\d\d, about \d+:\d\d left, memory [\d.]+ GiB$", line), line
    assert "phases of the run" in log
    assert re.search(r"evaluation before: untrained, 2 meta-episodes in [\d.]+ s, computed", log)

    # The phase table of report.md has every phase and adds up to its total.
    seconds, total = table_seconds((first / "report.md").read_text())
    for phase in (SETUP, "evaluation before: untrained", "evaluation before: reflexion",
                  ROLLOUTS, LEARNER, "saving", "evaluation after", "report", OTHER):  # fmt: skip
        assert phase in seconds, phase
    assert seconds[ROLLOUTS] > 0 and seconds[LEARNER] > 0
    # Rows are rounded to 0.1 s; the report row is counted up to the table itself.
    assert sum(seconds.values()) == pytest.approx(total, abs=0.06 * len(seconds))
    sessions = json.loads((first / "phases.json").read_text())["sessions"]
    assert len(sessions) == 1 and sessions[0]["iterations"] == [0, 1]
    assert sum(sessions[0]["seconds"].values()) <= sessions[0]["wall_s"]
    # The process's peak memory: in phases.json, the log and the report; each iteration's
    # memory in the metrics.
    assert sessions[0]["peak_rss_mb"] > 100
    assert re.search(r"peak resident memory: [\d.]+ GiB", log)
    assert re.search(r"Peak resident memory: [\d.]+ GiB", (first / "report.md").read_text())
    assert "phases" in json.loads((first / "report.json").read_text())
    lines = [json.loads(x) for x in (first / "metrics.jsonl").read_text().splitlines()]
    assert 0 < lines[0]["perf/elapsed_s"] <= sessions[0]["wall_s"]
    assert 100 < lines[0]["perf/rss_mb"] <= sessions[0]["peak_rss_mb"]

    # The same config again: both evaluations before training come from the cache.
    run = tmp_path / "again"
    args = ["train", str(CONFIG), "--run-dir", str(run), "--no-progress"]
    with caplog.at_level("INFO"):
        assert main(args + [a for o in OVERRIDES for a in ("--set", o)]) == 0
    assert "evaluation before: untrained, 2 meta-episodes" in caplog.text
    assert "from the cache" in caplog.text
    for label in ("untrained", "reflexion"):
        summary = json.loads((run / "eval" / f"{label}.json").read_text())
        assert summary["cache"]["hit"] is True
        computed = json.loads((first / "eval" / f"{label}.json").read_text())
        assert computed["cache"]["hit"] is False
        assert computed["cache"]["key"] == summary["cache"]["key"]
        assert (run / "eval" / f"{label}.jsonl").read_text() == (
            first / "eval" / f"{label}.jsonl"
        ).read_text()
    report = (run / "report.md").read_text()
    assert "From this machine's evaluation cache" in report
    assert "| evaluation before: untrained (cached) |" in report
