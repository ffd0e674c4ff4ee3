"""Next-token pretraining on game transcripts (mage_rl.rl.pretrain, mage pretrain)."""

from __future__ import annotations

import json

import pytest
import torch

from mage_rl.cli import main
from mage_rl.config import TrainConfig, load_config
from mage_rl.policy.models import load_model
from mage_rl.rl.pretrain import PretrainSettings, lm_loss, pretrain, train_lm

CONFIG = "configs/kuhn_adaptation_tiny.yaml"
SMALL = ["rollout.tasks=2", "rollout.group_size=2", "policy.model=tiny:hidden=32,layers=1"]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("field", "value"),
    [("batches", 0), ("epochs", 0), ("batch_size", 0), ("lr", 0.0), ("holdout", -1)],
)
def test_settings_reject_bad_values(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PretrainSettings(**{field: value})


def test_train_lm_lowers_the_loss_of_a_repeated_pattern() -> None:
    model, tokenizer = load_model("tiny:hidden=32,layers=1", dtype="fp32")
    seq = tokenizer("card K, you BET, opp PASS, +1")["input_ids"]
    sequences = [seq] * 40
    before = lm_loss(model, sequences[:8]).item()
    rows = train_lm(model, sequences, PretrainSettings(epochs=3, batch_size=8, holdout=8, lr=3e-3))
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows[-1]["holdout_loss"] < 0.5 * before
    assert not model.training


def test_train_lm_needs_enough_sequences() -> None:
    model, _ = load_model("tiny:hidden=32,layers=1", dtype="fp32")
    with pytest.raises(ValueError, match="too few"):
        train_lm(model, [[1, 2, 3]] * 10, PretrainSettings(batch_size=8, holdout=4))


def test_pretrain_writes_a_loadable_model_trained_on_both_seats(tmp_path) -> None:
    cfg = load_config(CONFIG, SMALL, cls=TrainConfig)
    out = tmp_path / "pretrained"
    lines: list[str] = []
    settings = PretrainSettings(batches=1, epochs=1, batch_size=8, holdout=4)
    summary = pretrain(cfg, out, settings, seats=["first", "second"], log=lines.append)
    # 2 seats x 2 tasks x 2 rollouts x 3 hands: at least one turn per hand.
    assert summary["sequences"] >= 24
    assert summary["seats"] == ["first", "second"]
    assert json.loads((out / "pretrain.json").read_text()) == summary
    assert any("seat second" in line for line in lines)
    trained, _ = load_model(str(out), dtype="fp32")
    initial, _ = load_model(cfg.policy.model, dtype="fp32")
    changed = [
        name
        for (name, a), (_, b) in zip(
            trained.named_parameters(), initial.named_parameters(), strict=True
        )
        if not torch.equal(a, b)
    ]
    assert changed, "pretraining left every weight unchanged"
    with pytest.raises(FileExistsError):
        pretrain(cfg, out, settings, log=lines.append)


def test_pretrain_refuses_a_seat_the_game_lacks(tmp_path) -> None:
    cfg = load_config(
        "configs/sokoban_tiny.yaml", ["policy.model=tiny:hidden=32,layers=1"], cls=TrainConfig
    )
    with pytest.raises(ValueError, match="seat"):
        pretrain(cfg, tmp_path / "p", PretrainSettings(batches=1), seats=["second"])


def test_cli(tmp_path) -> None:
    out = tmp_path / "cli_model"
    code = main(
        [
            "pretrain",
            CONFIG,
            "--out",
            str(out),
            "--batches",
            "1",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--holdout",
            "4",
            *[arg for s in SMALL for arg in ("--set", s)],
        ]
    )
    assert code == 0
    assert (out / "config.json").exists() and (out / "pretrain.json").exists()
    # The default holdout (512) is more than this tiny collection: a clear error, exit 2.
    small = [arg for s in SMALL for arg in ("--set", s)]
    assert main(["pretrain", CONFIG, "--out", str(tmp_path / "x"), "--batches", "1", *small]) == 2
