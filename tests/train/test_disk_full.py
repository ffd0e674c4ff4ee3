"""A run whose disk fills up stops with a message that says so and how to resume, exits
74, and resumes (once there is space) to the weights of a run that never stopped.

The fast tests put the failure in by hand (the ``OSError`` a full disk gives, and torch's
"unexpected pos" enforce failure, which is how a full disk looks to ``torch.save``); the
slow one trains on a real 4 MiB tmpfs, which needs root.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from mage_rl.cli import main
from mage_rl.fileio import WRITE_FAILED_EXIT, WriteError, write_error, writing
from mage_rl.rl.metrics_log import MetricsLogger
from mage_rl.train_folder import latest_checkpoint

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"
SETTINGS = ["rollout.tasks=1", "rollout.group_size=2", "eval.tasks=0", "policy.max_tokens=8",
            "meta.episodes=1", "train.iterations=3"]  # fmt: skip
TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 6016 vs 5908"


def _train(run: Path, *extra: str) -> int:
    sets = [arg for item in SETTINGS for arg in ("--set", item)]
    return main(["train", str(CONFIG), *sets, "--run-dir", str(run), "--no-progress", *extra])


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "checkpoints" / "iter_000003" / "model" / "model.safetensors")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    run = tmp_path_factory.mktemp("whole") / "run"
    assert _train(run) == 0
    return _weights(run)


def test_write_failures_are_told_apart() -> None:
    full = write_error(OSError(errno.ENOSPC, "No space left on device", "/r/m.jsonl"), "/r")
    assert full is not None and full.disk_full and full.path == Path("/r/m.jsonl")
    assert str(full).startswith("the disk is full: writing /r/m.jsonl failed")
    denied = write_error(PermissionError(errno.EACCES, "Permission denied"), "/r/x")
    assert denied is not None and not denied.disk_full
    assert str(denied) == "writing /r/x failed: [Errno 13] Permission denied"
    short = write_error(RuntimeError(TORCH_SHORT_WRITE), "/r/ckpt")
    assert short is not None and short.disk_full and "fewer bytes" in str(short)
    assert write_error(RuntimeError("shapes do not match"), "/r") is None
    assert write_error(ValueError("x"), "/r") is None
    with pytest.raises(ValueError), writing("/r"):
        raise ValueError("not a write")
    with pytest.raises(WriteError) as info, writing("/r/f"):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")
    assert info.value.disk_full and isinstance(info.value.__cause__, OSError)


def _fail_checkpoint(monkeypatch: pytest.MonkeyPatch, iteration: int, exc: Exception) -> None:
    """torch.save fails while the checkpoint of ``iteration`` is written."""
    real = torch.save

    def save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        if f"iter_{iteration:06d}" in str(f):
            Path(f).write_bytes(b"half")  # what a short write leaves
            raise exc
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def _fail_metrics(monkeypatch: pytest.MonkeyPatch, iteration: int) -> None:
    real = MetricsLogger.log

    def log(self: MetricsLogger, step: int, scalars: dict[str, float]) -> None:
        if step == iteration:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, step, scalars)

    monkeypatch.setattr(MetricsLogger, "log", log)


@pytest.mark.parametrize("where", ["torch_short_write", "checkpoint_enospc", "metrics_enospc"])
def test_a_full_disk_stops_the_run_with_the_resume_command_and_the_resume_matches(
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    uninterrupted: dict[str, torch.Tensor],
) -> None:
    run = tmp_path / "run"
    if where == "torch_short_write":
        _fail_checkpoint(monkeypatch, 2, RuntimeError(TORCH_SHORT_WRITE))
    elif where == "checkpoint_enospc":
        _fail_checkpoint(monkeypatch, 2, OSError(errno.ENOSPC, "No space left on device"))
    else:
        _fail_metrics(monkeypatch, 2)
    assert _train(run) == WRITE_FAILED_EXIT
    out = " ".join(capsys.readouterr().out.split())
    assert "error: the disk is full: writing" in out and "Traceback" not in out
    sets = " ".join(f"--set {item}" for item in SETTINGS)
    assert f"resume with: mage train {CONFIG} {sets} --resume --run-dir {run}" in out
    # The half-written checkpoint is gone; the one before it is complete.
    assert latest_checkpoint(run).name == "iter_000001"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001"]
    monkeypatch.undo()  # space again
    assert _train(run, "--resume") == 0
    assert _same(_weights(run), uninterrupted)


def test_a_full_disk_before_the_first_checkpoint_says_to_start_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    _fail_checkpoint(monkeypatch, 1, OSError(errno.ENOSPC, "No space left on device"))
    assert _train(run) == WRITE_FAILED_EXIT
    out = " ".join(capsys.readouterr().out.split())
    assert "then start it again with: mage train" in out and "--resume" not in out


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, check=False)  # fmt: skip
    return done.returncode == 0


@pytest.mark.slow
def test_a_run_on_a_4_mib_tmpfs_stops_cleanly_and_resumes_after_space_is_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], uninterrupted: dict[str, torch.Tensor]
) -> None:
    disk = Path("/tmp") / f"mage-tmpfs-{uuid.uuid4().hex[:8]}"
    if not _mount_tmpfs(disk, "4m"):
        pytest.skip("mounting a tmpfs needs root (and CAP_SYS_ADMIN)")
    try:
        run = disk / "run"
        assert _train(run) == WRITE_FAILED_EXIT
        out = " ".join(capsys.readouterr().out.split())
        assert "error: the disk is full: writing" in out and "--resume --run-dir" in out
        complete = latest_checkpoint(run)
        assert complete is not None and not list((run / "checkpoints").glob(".*tmp"))
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        assert _train(run, "--resume") == 0
        assert _same(_weights(run), uninterrupted)
    finally:
        subprocess.run(["umount", str(disk)], check=False)
        shutil.rmtree(disk, ignore_errors=True)
