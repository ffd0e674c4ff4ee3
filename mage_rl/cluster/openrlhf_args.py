"""OpenRLHF's argument namespace for a MAGE training config.

OpenRLHF's actors, strategy and engines read their settings from the namespace its
``train_ppo_ray`` command builds. Writing that namespace by hand would miss the many
defaults OpenRLHF keeps in its parser, so MAGE uses OpenRLHF's own parser:

1. :func:`openrlhf_parser` reads the installed ``openrlhf/cli/train_ppo_ray.py`` and runs
   the statements of its ``__main__`` block that build the ``argparse`` parser (they use
   nothing but ``argparse``), stopping before it parses ``sys.argv``. No other OpenRLHF
   module is imported, so this also works on a CPU machine.
2. :func:`openrlhf_flags` maps the MAGE config onto OpenRLHF flags: PPO clip, KL as a
   k3 loss, entropy bonus, a constant AdamW learning rate, mini-batch size, sampling
   settings and placement (the ``openrlhf:`` section). Free-form extra flags are
   appended last, so they win.
3. :func:`build_args` parses them, nests the namespace as OpenRLHF does
   (``args.actor.adam.lr``) and applies the post-parse rules of ``train_ppo_ray`` that
   matter for this use.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path
from typing import Any

from mage_rl.cluster.deps import require
from mage_rl.config import TrainConfig

_KL = {"low_var_kl": "k3", "k3": "k3", "k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2"}


def _stdlib_only(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        names = [node.module or ""] if node.level == 0 else [""]
    else:
        names = [alias.name for alias in node.names]
    return all(n and n.split(".")[0] in sys.stdlib_module_names for n in names)


def openrlhf_parser() -> argparse.ArgumentParser:
    """The argument parser of the installed OpenRLHF's ``train_ppo_ray`` command.

    Raises:
        ImportError: OpenRLHF is not installed.
        RuntimeError: The command's layout is not the one of OpenRLHF 0.11.
    """
    spec = importlib.util.find_spec("openrlhf.cli.train_ppo_ray")
    if spec is None or spec.origin is None:
        raise ImportError(
            "train.backend=openrlhf needs OpenRLHF; install it with: pip install "
            "'mage-rl[cluster]' on a CUDA machine (see docs/cluster.md)"
        )
    tree = ast.parse(Path(spec.origin).read_text(), filename=spec.origin)
    main = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ),
        None,
    )
    # The module's standard-library imports (argparse, datetime, os), then the parser.
    body: list[ast.stmt] = [
        node
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom) and _stdlib_only(node)
    ]
    for stmt in main.body if main is not None else []:
        if "parse_args" in ast.unparse(stmt):
            break
        body.append(stmt)
    namespace: dict[str, Any] = {"argparse": argparse}
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), spec.origin, "exec"), namespace)  # noqa: S102
    except Exception as err:  # noqa: BLE001 - any failure means an unknown layout
        raise RuntimeError(f"cannot build OpenRLHF's parser from {spec.origin}: {err}") from err
    parser = namespace.get("parser")
    if not isinstance(parser, argparse.ArgumentParser):
        raise RuntimeError(
            f"{spec.origin} does not build its parser as OpenRLHF 0.11 does; install "
            "openrlhf==0.11.2 (the version the cluster extra pins)"
        )
    return parser


def openrlhf_flags(cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False) -> list[str]:
    """OpenRLHF command-line flags equivalent to a MAGE training config.

    Raises:
        ValueError: For settings OpenRLHF cannot run (see the messages).
    """
    o, learner, policy = cfg.openrlhf, cfg.learner, cfg.policy
    model = Path(policy.model).expanduser()
    if policy.model in ("tiny", "smollm2") or not (model / "config.json").is_file():
        raise ValueError(
            f"policy.model={policy.model!r}: train.backend=openrlhf loads the model in vLLM "
            "and DeepSpeed from an HF directory on every node; set policy.model to such a "
            "directory (e.g. /models/Qwen3-4B)"
        )
    if policy.constrain_actions:
        raise ValueError(
            "policy.constrain_actions is not available with train.backend=openrlhf (the "
            "DeepSpeed actor scores the unrestricted distribution); set it to false"
        )
    if learner.lr_warmup_steps > 0:
        raise ValueError(
            "learner.lr_warmup_steps is not available with train.backend=openrlhf, whose "
            "actor warms up by a share of all its steps; set learner.lr_warmup_steps: 0"
        )
    if learner.kl_kind not in _KL:
        raise ValueError(f"learner.kl_kind={learner.kl_kind!r} has no OpenRLHF estimator")
    if learner.loss_terms:
        raise ValueError(
            f"learner.loss_terms={list(learner.loss_terms)}: registered loss terms run in "
            "the embedded learner (train.backend local or ray), not in OpenRLHF's actor"
        )
    if learner.dtype == "fp32":
        raise ValueError(
            "learner.dtype=fp32: OpenRLHF trains in bf16 (or fp16); set learner.dtype: bf16"
        )
    run_dir = Path(run_dir)
    flags = [
        "--actor.model_name_or_path", str(model),
        "--actor.num_nodes", str(o.actor_nodes),
        "--actor.num_gpus_per_node", str(o.actor_gpus_per_node),
        "--ref.num_nodes", str(o.ref_nodes),
        "--ref.num_gpus_per_node", str(o.ref_gpus_per_node),
        "--vllm.num_engines", str(o.vllm_engines),
        "--vllm.tensor_parallel_size", str(o.vllm_tensor_parallel),
        "--vllm.gpu_memory_utilization", str(o.vllm_gpu_memory_utilization),
        "--ds.zero_stage", str(o.zero_stage),
        "--ds.param_dtype", "bf16",
        "--train.micro_batch_size", str(o.micro_train_batch_size),
        "--rollout.micro_batch_size", str(o.micro_rollout_batch_size),
        # One optimizer step per mini-batch of samples (SPEC §6: 64), one PPO epoch.
        "--train.batch_size", str(learner.mini_batch_size),
        "--train.max_epochs", str(learner.ppo_epochs),
        "--rollout.batch_size", str(cfg.rollout.tasks),
        "--rollout.n_samples_per_prompt", str(cfg.rollout.group_size),
        "--data.max_len", str(o.max_len),
        "--rollout.max_new_tokens", str(policy.max_tokens),
        "--rollout.temperature", str(policy.temperature),
        "--rollout.top_p", str(policy.top_p),
        "--train.seed", str(cfg.rollout.seed),
        # The advantages are MAGE's; "reinforce" only keeps OpenRLHF from building a critic.
        "--algo.advantage.estimator", "reinforce",
        "--actor.policy_loss_type", "ppo",
        "--actor.loss_agg_mode", "token-mean",
        "--actor.eps_clip", str(learner.clip_eps),
        "--actor.entropy_coef", str(learner.entropy_coef),
        "--algo.kl.use_loss",
        "--algo.kl.init_coef", str(learner.kl_coef),
        "--algo.kl.estimator", _KL[learner.kl_kind],
        # SPEC §6: AdamW at a constant learning rate.
        "--actor.optim", "adam",
        "--actor.adam.lr", str(learner.lr),
        "--actor.adam.betas", str(learner.betas[0]), str(learner.betas[1]),
        "--actor.adam.eps", str(learner.adam_eps),
        "--actor.adam.weight_decay", str(learner.weight_decay),
        "--actor.lr_scheduler", "constant",
        "--actor.lr_warmup_ratio", "0",
        "--actor.max_norm", str(learner.max_grad_norm or 1e9),
        "--ckpt.path", str(run_dir / "checkpoints"),
        "--ckpt.output_dir", str(run_dir / "final"),
        "--ckpt.save_hf",
        "--ckpt.max_num", str(cfg.train.keep_checkpoints),
        "--ckpt.save_steps", str(cfg.train.save_every),
        "--logger.logging_steps", "1",
    ]  # fmt: skip
    if o.colocate_all:
        flags += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    if o.adam_offload:
        flags.append("--ds.adam_offload")
    if o.gradient_checkpointing:
        flags.append("--actor.gradient_checkpointing_enable")
    if learner.lora:
        flags += [
            "--ds.lora.rank", str(learner.lora_r),
            "--ds.lora.alpha", str(learner.lora_alpha),
            "--ds.lora.dropout", str(learner.lora_dropout),
            "--ds.lora.target_modules", *learner.lora_target_modules,
        ]  # fmt: skip
    if resume:
        flags.append("--ckpt.load_enable")
    return flags + list(o.extra_args)


def build_args(cfg: TrainConfig, run_dir: str | Path, *, resume: bool = False) -> Any:
    """OpenRLHF's nested argument namespace for ``cfg`` (see the module docstring)."""
    parser = openrlhf_parser()
    flat = parser.parse_args(openrlhf_flags(cfg, run_dir, resume=resume))
    args = require("openrlhf.utils.config", "train.backend=openrlhf").hierarchize(flat)
    # The post-parse rules of train_ppo_ray that apply to this use.
    if args.actor.eps_clip_low_high is None:
        args.actor.eps_clip_low_high = (args.actor.eps_clip, args.actor.eps_clip)
    threshold = list(args.algo.advantage.is_correction_threshold)
    if len(threshold) == 1:
        threshold.insert(0, 0.0)
    args.algo.advantage.is_correction_threshold = threshold
    args.critic.model_name_or_path = None
    args.reward.remote_url = None
    if not args.rollout.vllm_generate_batch_size:
        args.rollout.vllm_generate_batch_size = args.rollout.batch_size
    return args
