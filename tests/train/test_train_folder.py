"""The run folder survives kills: stopped starts, torn logs, retired checkpoints, resumes.

A kill is simulated by raising an exception that nothing in the trainer catches
(``Killed`` is not a ``KeyboardInterrupt``, so no emergency checkpoint is written) at the
named step of the real ``mage train`` entry point.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from mage_rl import train_folder
from mage_rl.cli import main
from mage_rl.rl.metrics_log import MetricsLogger, cut_metrics
from mage_rl.rl.trainer import Trainer
from mage_rl.train_folder import (
    STATE_FILE,
    check_resume_config,
    clear_retired,
    latest_checkpoint,
    retire_checkpoints,
    start_checkpoint,
)

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


class Killed(BaseException):
    """Stands for SIGKILL: not an Exception, not a KeyboardInterrupt."""


def _train(run: Path, *extra: str) -> int:
    return main(
        ["train", str(CONFIG), "--set", "rollout.tasks=1", "--set", "rollout.group_size=2",
         "--set", "eval.tasks=0", "--set", "policy.max_tokens=8", "--set", "meta.episodes=1", "--run-dir", str(run), "--no-progress", *extra]
    )  # fmt: skip


def _kill_at_save(monkeypatch: pytest.MonkeyPatch, iteration: int) -> None:
    save = Trainer.save

    def save_or_die(self: Trainer, it: int) -> Path:
        if it == iteration:
            raise Killed(f"killed while saving iteration {it}")
        return save(self, it)

    monkeypatch.setattr(Trainer, "save", save_or_die)


def _iterations(run: Path) -> list[int]:
    return [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _tensorboard_steps(run: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    return [e.step for e in events.Scalars("losses/loss")]


def test_tensorboard_follows_the_kept_metrics_whatever_the_file_names(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = MetricsLogger(run)
    for step in (1, 2, 3):
        first.log(step, {"losses/loss": float(step)})
    first.close()
    # An earlier file whose name sorts after any new one (two files of one second sort by
    # process id and a counter, as text): hiding steps by file order would fail here.
    (old,) = (run / "tb").glob("events.out.tfevents.*")
    old.rename(old.with_name("events.out.tfevents.9999999999.host.99999.9"))
    resumed = MetricsLogger(run, start_iteration=1)
    resumed.log(2, {"losses/loss": 20.0})
    resumed.close()
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 1
    assert _tensorboard_steps(run) == [1, 2]
    assert _iterations(run) == [1, 2]


# -- end to end: kills at the named steps ------------------------------------------------


def test_killed_runs_restart_and_log_each_iteration_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    # 1. Killed while saving the first checkpoint, after logging iteration 1.
    _kill_at_save(monkeypatch, 1)
    with pytest.raises(Killed):
        _train(run, "--set", "train.iterations=3")
    assert _iterations(run) == [1] and latest_checkpoint(run) is None
    # The same command starts over in the folder (it holds no run), and is killed between
    # logging iteration 2 and saving it.
    monkeypatch.undo()
    _kill_at_save(monkeypatch, 2)
    with pytest.raises(Killed):
        _train(run, "--set", "train.iterations=3")
    assert _iterations(run) == [1, 2] and latest_checkpoint(run).name == "iter_000001"
    # 2. A torn line from a write the kill cut short.
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 3, "charts/succ')
    monkeypatch.undo()
    assert _train(run, "--set", "train.iterations=3", "--resume") == 0
    assert _iterations(run) == [1, 2, 3]
    assert sorted(_tensorboard_steps(run)) == [1, 2, 3]
    assert latest_checkpoint(run).name == "iter_000003"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_000002",
        "iter_000003",
    ]

    # 5. A resume that changes what the checkpoint fixes is refused, and the run folder
    # (config.yaml first) is left as it was.
    saved = (run / "config.yaml").read_bytes()
    code = _train(run, "--set", "train.iterations=4", "--set", "learner.lr=0.5", "--resume")
    assert code == 2 and (run / "config.yaml").read_bytes() == saved
    assert latest_checkpoint(run).name == "iter_000003" and _iterations(run) == [1, 2, 3]
    # 9. Resuming the tiny-model run with another model is refused before any loading.
    code = _train(run, "--set", "policy.model=smollm2", "--resume")
    assert code == 2 and (run / "config.yaml").read_bytes() == saved
    # A longer run is a change a resume may make.
    assert _train(run, "--set", "train.iterations=4", "--resume") == 0
    assert _iterations(run) == [1, 2, 3, 4]
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["iterations"] == 4


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("env.seat=third", "env.seat='third'"),
        ("policy.model=/no/such/model", "policy.model='/no/such/model': no such file"),
        ("env.population=kuhn_trian", "env.population='kuhn_trian'"),
        ("env.population=kuhn:bluffer", "kuhn:bluffer"),
        ("rollout.tasks=true", "rollout.tasks: Input should be a valid integer, got true"),
        ("env.population=kuhn:aggressive=nan", "env.population='kuhn:aggressive=nan'"),
        ("learner.lr=true", "learner.lr: Input should be a valid number, got true"),
        ("meta.stop_on_success=1", "meta.stop_on_success: Input should be a valid boolean"),
        ("policy.modle=tiny", "policy.modle: unknown key; did you mean 'model'?"),
    ],
)
def test_config_errors_leave_no_run_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    run = tmp_path / "run"
    assert _train(run, "--set", override) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert message in out and f"(from --set {override})" in out
    assert not run.exists()


def test_resume_of_a_folder_without_a_run_says_how_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path / "never", "--resume") == 2
    assert "without --resume" in capsys.readouterr().out
    assert not (tmp_path / "never").exists()


# -- the pieces ------------------------------------------------------------------------


def _checkpoint(root: Path, iteration: int, complete: bool = True) -> Path:
    path = root / f"iter_{iteration:06d}"
    (path / "model").mkdir(parents=True)
    (path / "model" / "model.safetensors").write_bytes(b"weights")
    if complete:
        (path / STATE_FILE).write_text(json.dumps({"iteration": iteration}))
    return path


def test_a_kill_mid_deletion_never_leaves_a_countable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "checkpoints"
    for i in (4, 5, 6):
        _checkpoint(root, i)
    real_rmtree = shutil.rmtree

    def rmtree_killed_halfway(path: Path, ignore_errors: bool = False) -> None:
        (Path(path) / "model" / "model.safetensors").unlink()  # part of it is gone
        raise Killed

    monkeypatch.setattr(train_folder.shutil, "rmtree", rmtree_killed_halfway)
    with pytest.raises(Killed):
        retire_checkpoints(root, saved=6, keep=1)
    monkeypatch.setattr(train_folder.shutil, "rmtree", real_rmtree)
    # The half-deleted folder kept its trainer_state.json, but no longer an iter_ name.
    names = sorted(p.name for p in root.iterdir())
    assert names == [".retired-iter_000004", "iter_000005", "iter_000006"]
    assert (root / ".retired-iter_000004" / STATE_FILE).exists()
    assert latest_checkpoint(tmp_path) == root / "iter_000006"
    clear_retired(root)
    assert sorted(p.name for p in root.iterdir()) == ["iter_000005", "iter_000006"]


def test_retirement_keeps_the_newest_complete_and_drops_strays(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _checkpoint(root, 1)
    _checkpoint(root, 2, complete=False)  # a save the kill cut short
    _checkpoint(root, 3)
    _checkpoint(root, 9, complete=False)  # from a stretch abandoned by a resume
    (root / "iter_000001_hf").mkdir()  # a companion folder (OpenRLHF's HF export)
    retired = retire_checkpoints(root, saved=3, keep=2, companions=("_hf",))
    assert [p.name for p in retired] == ["iter_000002", "iter_000009"]
    assert sorted(p.name for p in root.iterdir()) == [
        "iter_000001",
        "iter_000001_hf",
        "iter_000003",
    ]
    retire_checkpoints(root, saved=3, keep=1, companions=("_hf",))
    assert sorted(p.name for p in root.iterdir()) == ["iter_000003"]


def test_metrics_are_cut_back_to_the_checkpoint_and_a_torn_line_dropped(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"iteration": i, "x": i}) for i in (1, 2, 3)]
    path.write_text("\n".join(lines) + '\n{"iteration": 4, "x"')
    kept = cut_metrics(path, 2)
    assert [row["iteration"] for row in kept] == [1, 2]
    assert path.read_text() == lines[0] + "\n" + lines[1] + "\n"
    path.write_text(lines[0] + "\nnot json\n" + lines[1] + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a metrics line"):
        cut_metrics(path, 5)


def test_which_folders_hold_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert start_checkpoint(run, resume=False) is None  # nothing there: a fresh start
    with pytest.raises(FileNotFoundError, match="no run to resume"):
        start_checkpoint(run, resume=True)
    run.mkdir()
    (run / "config.yaml").write_text("policy: {model: tiny}\n")
    (run / "metrics.jsonl").write_text("")
    _checkpoint(run / "checkpoints", 1, complete=False)
    # Started, but stopped before its first complete checkpoint: not a run yet.
    assert start_checkpoint(run, resume=False) is None
    assert start_checkpoint(run, resume=True) is None  # --resume starts from iteration 0
    done = _checkpoint(run / "checkpoints", 2)
    with pytest.raises(FileExistsError, match="--resume"):
        start_checkpoint(run, resume=False)
    assert start_checkpoint(run, resume=True) == done


def test_resume_config_check_names_each_fixed_key(tmp_path: Path) -> None:
    saved = {
        "learner": {"lr": 1e-4, "betas": [0.9, 0.999]},
        "train": {"iterations": 3},
        "eval": {"every": 0},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    checkpoint = tmp_path / "checkpoints" / "iter_000003"
    longer = {**saved, "train": {"iterations": 9}, "eval": {"every": 2}}
    check_resume_config(tmp_path, longer, checkpoint)  # no error
    changed = {**saved, "learner": {"lr": 0.5, "betas": [0.9, 0.95]}}
    with pytest.raises(ValueError) as info:
        check_resume_config(tmp_path, changed, checkpoint)
    message = str(info.value)
    assert "learner.lr (saved 0.0001, now 0.5)" in message
    assert "learner.betas (saved [0.9, 0.999], now [0.9, 0.95])" in message
    assert "iter_000003" in message and "policy.model=" in message


def test_a_checkpoint_of_another_model_size_is_named_not_a_traceback(tmp_path: Path) -> None:
    from mage_rl.policy.models import load_model
    from mage_rl.rl.learner import Learner, LearnerConfig

    small, _ = load_model("tiny", dtype="fp32")
    Learner(small, LearnerConfig(dtype="fp32")).save(tmp_path / "iter_000001")
    wider, _ = load_model("tiny:hidden=96", dtype="fp32")
    with pytest.raises(ValueError, match="another size than policy.model.*config.yaml"):
        Learner(wider, LearnerConfig(dtype="fp32")).load(tmp_path / "iter_000001")
