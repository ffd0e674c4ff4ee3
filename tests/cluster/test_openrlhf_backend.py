"""The OpenRLHF backend's CPU-testable parts: its flags, settings checks and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.cli import main
from mage_rl.cluster.backends import trainer_class
from mage_rl.cluster.openrlhf_backend import learner_stats
from mage_rl.config import TrainConfig, load_config

pytest.importorskip("openrlhf", reason="the dev set-up installs openrlhf (scripts/setup.sh dev)")
from mage_rl.cluster.openrlhf_args import build_args, openrlhf_flags, openrlhf_parser  # noqa: E402

ROOT = Path(__file__).parents[2]
PAPER = ROOT / "configs" / "paper" / "kuhn_qwen3_4b_openrlhf.yaml"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "Qwen3-4B"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return path


def _paper(model_dir: Path, *overrides: str) -> TrainConfig:
    return load_config(PAPER, [f"policy.model={model_dir}", *overrides], TrainConfig)


def test_paper_config_becomes_openrlhf_args(model_dir: Path, tmp_path: Path) -> None:
    args = build_args(_paper(model_dir), tmp_path / "run")
    assert args.actor.model_name_or_path == str(model_dir)
    # SPEC §6 through OpenRLHF's own parser: PPO clip 0.2, k3 KL as a loss with 0.1,
    # entropy 0.001, constant AdamW 1e-6, mini-batch 64, one epoch, token-mean.
    assert args.actor.eps_clip_low_high == (0.2, 0.2)
    assert args.algo.kl.use_loss and args.algo.kl.estimator == "k3"
    assert args.algo.kl.init_coef == 0.1 and args.actor.entropy_coef == 0.001
    assert args.actor.adam.lr == 1e-6 and args.actor.lr_scheduler == "constant"
    assert args.train.batch_size == 64 and args.train.max_epochs == 1
    assert args.actor.loss_agg_mode == "token-mean"
    assert args.rollout.temperature == 1.0 and args.rollout.max_new_tokens == 1024
    # Placement: 8 colocated GPUs, sleeping engines, ZeRO-3; no critic, no reward model.
    assert args.vllm.num_engines == 8 and args.train.colocate_all and args.vllm.enable_sleep
    assert args.ds.zero_stage == 3 and args.critic.model_name_or_path is None
    assert args.reward.remote_url is None
    assert args.ckpt.path == str(tmp_path / "run" / "checkpoints") and args.ckpt.save_hf
    # OpenRLHF defaults we did not set come from its parser.
    assert args.actor.gradient_checkpointing_reentrant is False
    assert args.algo.advantage.is_correction_level == "off"


def test_extra_args_pass_through_and_win(model_dir: Path, tmp_path: Path) -> None:
    cfg = _paper(model_dir, "openrlhf.extra_args=['--vllm.enable_prefix_caching', "
                 "'--actor.adam.lr', '2e-6']")  # fmt: skip
    args = build_args(cfg, tmp_path, resume=True)
    assert args.vllm.enable_prefix_caching and args.actor.adam.lr == 2e-6
    assert args.ckpt.load_enable


def test_every_flag_is_one_openrlhf_knows(model_dir: Path, tmp_path: Path) -> None:
    known = {s for a in openrlhf_parser()._actions for s in a.option_strings}
    flags = openrlhf_flags(_paper(model_dir, "learner.lora=true"), tmp_path)
    assert {f for f in flags if f.startswith("--")} <= known


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("policy.model=tiny", "HF directory"),
        ("learner.dtype=fp32", "bf16"),
        ("policy.constrain_actions=true", "constrain_actions"),
        ("learner.lr_warmup_steps=2", "lr_warmup_steps"),
    ],
)
def test_settings_openrlhf_cannot_run_are_refused(
    model_dir: Path, tmp_path: Path, override: str, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        openrlhf_flags(_paper(model_dir, override), tmp_path)


def test_colocation_needs_matching_gpu_counts(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="colocate_all"):
        _paper(model_dir, "openrlhf.vllm_engines=4")
    cfg = _paper(model_dir, "openrlhf.vllm_engines=4", "openrlhf.colocate_all=false")
    assert cfg.openrlhf.vllm_engines == 4


def test_openrlhf_status_maps_to_local_statistics() -> None:
    stats = learner_stats(
        {"policy_loss": 0.5, "kl": 0.2, "entropy_loss": 3.0, "ppo_clip_ratio": 0.1,
         "ppo_kl": 0.01, "actor_grad_norm": 2.0, "timing/ppo_train": 2.0,
         "rollout/num_samples": 10, "rollout/response_length_mean": 4.0},
        kl_coef=0.1, entropy_coef=0.001,
    )  # fmt: skip
    assert stats["loss"] == pytest.approx(0.5 + 0.02 - 0.003)
    assert stats["clip_frac"] == 0.1 and stats["grad_norm"] == 2.0
    assert stats["tokens_per_s"] == pytest.approx(20.0)


def test_backend_without_the_gpu_stack_says_what_to_install(
    model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("ray")
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed")
    with pytest.raises(ImportError, match=r"cluster\]"):
        trainer_class("openrlhf")(_paper(model_dir), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # nothing half-made
    code_or_error = None
    try:
        code_or_error = main(["train", str(PAPER), "--set", f"policy.model={model_dir}",
                              "--run-dir", str(tmp_path / "cli"), "--no-progress"])  # fmt: skip
    except ImportError as err:
        code_or_error = str(err)
    assert "vllm" in str(code_or_error)
