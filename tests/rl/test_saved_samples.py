"""What a run folder shows of the credit (issue #42): the two-call planner example trains
with ``train.save_samples=1``; its samples files give back, call by call, the advantages
the learner used, and its metrics hold the credit of every node."""

from __future__ import annotations

import errno
import gzip
import json
import shutil
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.config import load_config
from mage_rl.fileio import WRITE_FAILED_EXIT
from mage_rl.rl.advantages import compute_advantages, credit_parts
from mage_rl.rl.samples import read_samples, sample_path, sample_record, samples_due

PLANNER = Path(__file__).parents[2] / "examples" / "extending" / "planner_kuhn_tiny.yaml"
# Constrained answers are valid, so episodes end with rewards and the returns vary.
SETTINGS = ["--set", "train.save_samples=1", "--set", "eval.tasks=0",
            "--set", "policy.constrain_actions=true"]  # fmt: skip
NODE_KEYS = ("calls", "tokens", "return_mean", "return_std", "advantage_mean", "advantage_std",
             "a_episode_mean", "a_step_mean", "entropy")  # fmt: skip


def _train(run: Path, *extra: str) -> int:
    return main(["train", str(PLANNER), "--run-dir", str(run), "--no-progress",
                 "--set", "train.iterations=2", *SETTINGS, *extra])  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("credit") / "planner"
    assert _train(folder) == 0
    return folder


def _check_samples(run: Path, iteration: int) -> list[dict]:
    """The file's advantages are what compute_advantages gives its rebuilt records."""
    rows = list(read_samples(sample_path(run, iteration)))
    cfg = load_config(run / "config.yaml")
    assert len(rows) == cfg.rollout.tasks * cfg.rollout.group_size
    assert {r["iteration"] for r in rows} == {iteration}
    records = [sample_record(r) for r in rows]
    advantages = compute_advantages(records, cfg.returns, cfg.advantages)
    for row, advs in zip(rows, advantages, strict=True):
        assert [c["advantage"] for c in row["calls"]] == advs  # exactly, call by call
    for row, parts in zip(rows, credit_parts(records, cfg.returns, cfg.advantages), strict=True):
        for call, part in zip(row["calls"], parts, strict=True):
            assert (call["return"], call["score"], call["a_episode"], call["a_step"]) == (
                part.ret, part.score, part.a_episode, part.a_step
            )  # fmt: skip
    return rows


def test_samples_give_back_the_trained_advantages(run: Path) -> None:
    rows = _check_samples(run, 1) + _check_samples(run, 2)
    calls = [c for r in rows for c in r["calls"]]
    assert {(c["node"], c["kind"]) for c in calls} == {
        ("plan", "call"), ("act", "play"), ("reflect", "reflect")
    }  # fmt: skip
    assert any(c["a_step"] != 0 for c in calls if c["node"] == "plan")
    assert any(c["a_step"] != 0 for c in calls if c["node"] == "act")
    act = next(c for c in calls if c["node"] == "act")
    assert act["acting"] and not act["invalid"] and act["response"].startswith("<action>")
    assert isinstance(act["prompt"], list) and act["prompt"][0]["role"] == "system"
    assert act["prompt"][-1]["content"].startswith("Now give your move")
    assert len(act["tokens"]) == len(act["logprobs"]) > 0
    assert "".join(act["tokens"]) == act["response"]
    row = rows[0]
    assert {"uid", "rollout", "env", "seed", "opponent", "seat", "agent"} <= set(row)
    assert row["agent"] == "planner" and row["episodes"][0]["index"] == 0


def test_index_lists_the_files_with_provenance(run: Path) -> None:
    index = json.loads((run / "samples" / "index.json").read_text())
    assert [(e["file"], e["iteration"], e["meta_episodes"]) for e in index["files"]] == [
        ("iter_000001.jsonl.gz", 1, 4), ("iter_000002.jsonl.gz", 2, 4)
    ]  # fmt: skip
    calls = sum(len(r["calls"]) for r in read_samples(sample_path(run, 2)))
    assert index["files"][1]["calls"] == calls
    assert "commit" in index["provenance"] and "command" in index["provenance"]
    assert len(list(read_samples(run))) == 8  # a run folder reads as all its files


def test_metrics_hold_the_credit_of_every_node(run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for node in ("plan", "act", "reflect"):
        for key in NODE_KEYS:
            assert f"nodes/{node}/{key}" in lines[0], (node, key)
    assert "nodes/act/invalid_share" in lines[0]
    assert "nodes/plan/invalid_share" not in lines[0]  # plans never act
    rows = list(read_samples(sample_path(run, 1)))
    plans = [c for r in rows for c in r["calls"] if c["node"] == "plan"]
    assert lines[0]["nodes/plan/calls"] == len(plans)
    assert lines[0]["nodes/plan/tokens"] == sum(len(c["tokens"]) for c in plans)
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"nodes/plan/advantage_mean", "nodes/act/a_step_mean", "nodes/reflect/entropy"} <= set(
        tags
    )
    assert [e.step for e in events.Scalars("nodes/act/return_mean")] == [1, 2]


def test_a_resume_rewrites_the_iterations_it_plays_again(run: Path, tmp_path: Path) -> None:
    # As after a kill between iteration 2's samples and its checkpoint, with a file of a
    # longer earlier start and a torn temporary file lying around.
    copy = tmp_path / "planner"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "iter_000002")
    first = sample_path(copy, 1).read_bytes()
    sample_path(copy, 2).write_bytes(b"not what iteration 2 writes")
    shutil.copy(sample_path(copy, 1), sample_path(copy, 5))
    (copy / "samples" / ".iter_000003.jsonl.gz.1.tmp").write_bytes(b"\x1f\x8b")
    assert _train(copy, "--resume") == 0
    assert sorted(p.name for p in (copy / "samples").iterdir()) == [
        "index.json", "iter_000001.jsonl.gz", "iter_000002.jsonl.gz"
    ]  # fmt: skip
    assert sample_path(copy, 1).read_bytes() == first
    _check_samples(copy, 2)
    index = json.loads((copy / "samples" / "index.json").read_text())
    assert [e["iteration"] for e in index["files"]] == [1, 2]


def test_which_iterations_save_samples() -> None:
    assert [i for i in range(1, 13) if samples_due(i, 12, 5)] == [5, 10, 12]
    assert [i for i in range(1, 4) if samples_due(i, 3, 1)] == [1, 2, 3]
    assert not any(samples_due(i, 12, 0) for i in range(1, 13))


def test_a_full_disk_while_writing_samples_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "full"
    small = ["--set", "rollout.tasks=1", "--set", "meta.episodes=1"]
    real = gzip.GzipFile.write

    def write(self: gzip.GzipFile, data: bytes) -> int:
        if "iter_000002" in str(self.name):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(gzip.GzipFile, "write", write)
    assert _train(run, *small) == WRITE_FAILED_EXIT
    assert sorted(p.name for p in (run / "samples").iterdir()) == [
        "index.json", "iter_000001.jsonl.gz"
    ]  # fmt: skip
    monkeypatch.undo()  # space again
    assert _train(run, *small, "--resume") == 0
    _check_samples(run, 2)
