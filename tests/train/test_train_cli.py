"""The real `mage train` entry point with a tiny budget (CleanRL-style)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"


@pytest.fixture
def run_dir(kuhn_tiny_run: Path) -> Path:
    """Two iterations of kuhn_tiny (shared with the Ray backend tests: read, never change)."""
    return kuhn_tiny_run


def test_train_leaves_checkpoint_events_and_metrics(run_dir: Path) -> None:
    model_dir = run_dir / "checkpoints" / "iter_000002" / "model"
    assert (model_dir / "config.json").exists() and (model_dir / "tokenizer.json").exists()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines[:2]] == [1, 2]
    for key in ("charts/success@1", "charts/success@3", "losses/loss", "losses/kl",
                "losses/clip_frac", "losses/entropy", "losses/entropy_free",
                "losses/grad_norm",
                "perf/rollout_s", "perf/learn_s", "perf/learner_tokens_per_s"):  # fmt: skip
        assert key in lines[0], key
    # Kuhn prompts open alike: the learner's prefix trees compute each shared prefix once.
    assert lines[0]["perf/learner_token_ratio"] > 2
    assert any("eval/success@1" in x for x in lines)
    assert (run_dir / "eval" / "iter_000002.json").exists()


def test_training_changed_the_weights(run_dir: Path) -> None:
    from mage_rl.policy.models import load_model

    initial, _ = load_model("tiny", dtype="fp32")
    trained = load_file(run_dir / "checkpoints" / "iter_000002" / "model" / "model.safetensors")
    changed = [
        k
        for k, v in initial.state_dict().items()
        if k in trained and not torch.equal(v, trained[k])
    ]
    assert changed


def test_checkpoint_loads_as_a_model(run_dir: Path) -> None:
    from mage_rl.policy.models import load_model

    model, tokenizer = load_model(str(run_dir / "checkpoints" / "iter_000002" / "model"), "fp32")
    assert tokenizer.chat_template


def test_resume_continues_from_the_saved_step_with_optimizer_state(
    run_dir: Path, tmp_path: Path
) -> None:
    run_dir = Path(shutil.copytree(run_dir, tmp_path / "kuhn_tiny"))
    opt_before = torch.load(run_dir / "checkpoints" / "iter_000002" / "optimizer.pt")
    code = main(
        ["train", str(CONFIG), "--set", "train.iterations=3", "--run-dir", str(run_dir),
         "--resume", "--no-progress"]
    )  # fmt: skip
    assert code == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines if "losses/loss" in x] == [1, 2, 3]
    opt_after = torch.load(run_dir / "checkpoints" / "iter_000003" / "optimizer.pt")
    # AdamW's step counter went on from the saved state instead of restarting at 0.
    step_before = float(next(iter(opt_before["state"].values()))["step"])
    step_after = float(next(iter(opt_after["state"].values()))["step"])
    learner_steps = json.loads(
        (run_dir / "checkpoints" / "iter_000003" / "learner.json").read_text()
    )
    assert step_after > step_before >= 2
    assert learner_steps["step"] == step_after
    assert not (run_dir / "checkpoints" / "iter_000001").exists()  # keep_checkpoints: 2
    # The phase table adds the resumed session to the first one and says so.
    sessions = json.loads((run_dir / "phases.json").read_text())["sessions"]
    assert [(s["resumed_from"], s["iterations"]) for s in sessions] == [(None, [0, 2]), (2, [2, 3])]
    assert "2 sessions (resumed from iteration 2)" in (run_dir / "report.md").read_text()


def test_starting_over_an_existing_run_is_refused(run_dir: Path, capsys) -> None:
    code = main(["train", str(CONFIG), "--run-dir", str(run_dir), "--no-progress"])
    assert code == 2 and "--resume" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("learner.lrr=1", "learner.lrr"),
        ("returns.mode=best", "returns"),
        ("policy.top_p=0.8", "top_p"),
        ("env.population=ttt_train", "does not play"),
        ("rollout.group_size=1", "group_size"),
        ("policy.temperature=0.7", "learner.temperature"),
    ],
)
def test_bad_config_names_the_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(CONFIG, [override], TrainConfig)


def test_cli_reports_bad_config(capsys) -> None:
    assert main(["train", str(CONFIG), "--set", "meta.episodez=2"]) == 2
    assert "meta.episodez" in capsys.readouterr().out


def test_rollout_cli_writes_jsonl(tmp_path) -> None:
    from mage_rl.graphs.rollouts import read_jsonl

    out = tmp_path / "r.jsonl"
    assert main(["rollout", "--config", str(CONFIG), "--out", str(out),
                 "--set", "rollout.tasks=1", "--set", "rollout.group_size=2"]) == 0  # fmt: skip
    records = read_jsonl(out)
    assert len(records) == 2 and records[0].uid == records[1].uid
    assert all(t.response_ids for r in records for t in r.turns)
