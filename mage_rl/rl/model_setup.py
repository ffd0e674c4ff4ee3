"""The policy model as the learner holds it: master weights, LoRA, reference, autocast.

:class:`~mage_rl.rl.learner.Learner` trains float32 master weights (or LoRA adapters in
float32 over a base of any dtype), in eval mode so that dropout never makes the ratio of
fresh on-policy samples differ from 1, and autocasts only the forward pass.
"""

from __future__ import annotations

import copy
import inspect
import logging
from typing import Any

import torch
from torch import nn

from mage_rl.policy.models import DType, cpu_supports_bf16
from mage_rl.rl.path_attention import NAME as PATH_ATTENTION
from mage_rl.rl.path_attention import use_path_attention
from mage_rl.sections import LearnerConfig

logger = logging.getLogger(__name__)


def resolve_autocast_dtype(dtype: DType, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for the forward pass, or ``None`` for plain float32."""
    if dtype == "fp32":
        return None
    if dtype == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        return torch.bfloat16 if cpu_supports_bf16() else None
    return None


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` carries PEFT (LoRA) adapters."""
    try:
        from peft import PeftModel
    except ImportError:  # peft is a core dependency, but keep plain models working without it
        return False
    return isinstance(model, PeftModel)


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model.forward`` can skip the logits of prompt positions (HF ``logits_to_keep``)."""
    try:
        return "logits_to_keep" in inspect.signature(_base(model).forward).parameters
    except (TypeError, ValueError):
        return False


def accepts_tree_mask(model: nn.Module) -> bool:
    """Whether ``model`` attends under a custom boolean ``(B, 1, Q, K)`` mask with its own
    ``position_ids``, as a packed prefix tree needs: Hugging Face models running SDPA
    attention (the default on CPUs and most GPUs), or its path variant
    (:mod:`mage_rl.rl.path_attention`) that a learner switched them to."""
    config = getattr(_base(model), "config", None)
    return getattr(config, "_attn_implementation", None) in ("sdpa", PATH_ATTENTION)


def attend_along_paths(model: nn.Module) -> None:
    """Switch a model that :func:`accepts_tree_mask` to attention along a tree's paths
    when a batch carries them (:mod:`mage_rl.rl.path_attention`); other batches attend as
    under SDPA."""
    use_path_attention(_base(model))


def _base(model: nn.Module) -> Any:
    """The Hugging Face model under PEFT adapters, or ``model``."""
    return model.get_base_model() if is_peft_model(model) else model  # type: ignore[operator]


def freeze(model: nn.Module) -> nn.Module:
    """``model`` with no trainable parameter, in eval mode."""
    model.requires_grad_(False)
    return model.eval()


def prepare_policy(model: nn.Module, cfg: LearnerConfig) -> nn.Module:
    """The model as the learner trains it: float32 master weights, or LoRA adapters in
    float32 on a base of any dtype; in eval mode (dropout off)."""
    if cfg.lora and not is_peft_model(model):
        from peft import LoraConfig, get_peft_model

        lora_cfg = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora_cfg)
    elif is_peft_model(model) and not cfg.lora:
        raise ValueError("the model already carries PEFT adapters; set lora: true to train them")
    if cfg.lora:
        # Only the adapters are optimized; keep them in float32. The frozen base takes
        # the forward pass's dtype when that is bf16: half the memory, and no cast of
        # every weight in every pass.
        device = next(model.parameters()).device
        base = resolve_autocast_dtype(cfg.dtype, device) or torch.float32
        for p in model.parameters():
            wanted = torch.float32 if p.requires_grad else base
            if p.dtype != wanted and p.is_floating_point():
                p.data = p.data.to(wanted)
    elif any(p.dtype != torch.float32 for p in model.parameters()):
        logger.info("casting the policy to float32 master weights")
        model = model.float()
    return model.eval()


def make_reference(
    model: nn.Module, ref_model: nn.Module | None, cfg: LearnerConfig
) -> nn.Module | None:
    """The frozen reference of the KL term: ``ref_model``, a copy of ``model`` (full
    fine-tuning) or none (no KL term, or LoRA, whose base with adapters off is the
    reference)."""
    if ref_model is not None:
        return freeze(ref_model)
    if cfg.kl_coef <= 0 or cfg.lora:
        return None
    return freeze(copy.deepcopy(model))
