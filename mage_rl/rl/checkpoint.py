"""Learner checkpoints: save, export and restore a :class:`~mage_rl.rl.learner.Learner`.

A checkpoint folder holds ``model/`` (a complete Hugging Face model, LoRA merged, that
``mage serve``, ``vllm serve`` and ``load_model`` read), ``adapter/`` (LoRA only),
``optimizer.pt``, ``rng.pt`` and ``learner.json`` (step, entropy weight, config). It is
written into a temporary sibling and renamed into place, so a crash never leaves half of
one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mage_rl.train_folder import MODEL_DIR

ADAPTER_DIR = "adapter"


class LearnerCheckpoints:
    """Checkpoint I/O of :class:`~mage_rl.rl.learner.Learner` (mixed into it).

    Uses the learner's ``config``, ``model``, ``optimizer``, ``device``, ``step``,
    shuffling generator and :meth:`state_dict_for_inference`.
    """

    config: Any
    model: Any
    optimizer: Any
    device: torch.device
    step: int
    _generator: torch.Generator
    state_dict_for_inference: Callable[[], dict[str, torch.Tensor]]
    _check_not_released: Callable[[], None]

    def _rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "shuffle": self._generator.get_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Save model (HF ``save_pretrained``), optimizer and RNG.

        ``model/`` is always a complete HF model that ``mage serve``, ``vllm serve`` and
        ``load_model`` read. With LoRA it holds the merged weights
        (:meth:`state_dict_for_inference`) and the adapters alone go to ``adapter/``,
        which :meth:`load` restores. Everything is written to a temporary sibling
        directory that then replaces ``directory`` by renames, so a crash never leaves a
        half-written checkpoint; a write that fails (a full disk) removes the temporary
        directory and leaves ``directory`` as it was.

        Returns:
            The checkpoint directory.
        """
        self._check_not_released()
        target = Path(directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        old = target.with_name(f".{target.name}.old")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            if self.config.lora:
                self.model.save_pretrained(tmp / ADAPTER_DIR)
                self.export(tmp / MODEL_DIR)
            else:
                self.model.save_pretrained(tmp / MODEL_DIR)
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self._rng_state(), tmp / "rng.pt")
            meta = {
                "step": self.step,
                "lora": self.config.lora,
                "config": self.config.model_dump(),
            }
            (tmp / "learner.json").write_text(json.dumps(meta, indent=2))
        except Exception:
            # A failed write (a full disk, most often): give the space of the half-written
            # copy back; the checkpoints already in place are untouched.
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if old.exists():
            shutil.rmtree(old)
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
        if old.exists():
            shutil.rmtree(old)
        return target

    def export(self, directory: str | os.PathLike[str]) -> Path:
        """Write the current policy as a plain HF model directory (LoRA merged).

        Args:
            directory: Where ``config.json`` and the safetensors weights go; the caller
                adds the tokenizer (``tokenizer.save_pretrained``).

        Returns:
            ``directory``.
        """
        target = Path(directory)
        model = self.model.get_base_model() if self.config.lora else self.model
        # The base of a PEFT model still carries the adapter layers; the state dict given
        # here has the plain architecture's names, so the files describe a plain model.
        model.save_pretrained(target, state_dict=self.state_dict_for_inference())
        return target

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Restore a checkpoint written by :meth:`save` into this learner.

        The learner must wrap the same architecture (and, with LoRA, the same base
        weights: only adapters are restored). A checkpoint interrupted between its two
        renames is found under its ``.old`` name.
        """
        path = Path(directory)
        if not (path / "learner.json").exists():
            fallback = path.with_name(f".{path.name}.old")
            if not (fallback / "learner.json").exists():
                raise FileNotFoundError(f"no learner checkpoint at {path}")
            path = fallback
        meta = json.loads((path / "learner.json").read_text())
        if bool(meta["lora"]) != self.config.lora:
            raise ValueError(
                f"checkpoint {path} was saved with lora={meta['lora']} but this learner has "
                f"lora={self.config.lora}; build the learner with the same setting"
            )
        self._load_weights(path / MODEL_DIR)
        self.optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        )
        rng = torch.load(path / "rng.pt", weights_only=True)
        torch.set_rng_state(rng["torch"])
        self._generator.set_state(rng["shuffle"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.step = int(meta["step"])

    def _load_weights(self, model_dir: Path) -> None:
        from safetensors.torch import load_file

        if self.config.lora:
            from peft import set_peft_model_state_dict

            # Adapters sit in adapter/ next to the merged model/; older checkpoints kept
            # them in model/ itself.
            adapter = model_dir.parent / ADAPTER_DIR / "adapter_model.safetensors"
            if not adapter.exists():
                adapter = model_dir / "adapter_model.safetensors"
            result = set_peft_model_state_dict(self.model, load_file(adapter))
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            if unexpected:
                raise ValueError(
                    f"adapter checkpoint {model_dir} has unexpected keys {unexpected[:5]}"
                )
            return
        index = model_dir / "model.safetensors.index.json"
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            files = [model_dir / s for s in shards]
        else:
            files = [model_dir / "model.safetensors"]
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(file))
        try:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
        except RuntimeError as exc:  # tensors of other shapes: another model's checkpoint
            first = str(exc).split("size mismatch for ", 1)[-1].split("\n")[0]
            raise ValueError(
                f"checkpoint {model_dir} was saved from a model of another size than "
                f"policy.model ({first}); resume with the policy.model the run was "
                "started with (its config.yaml)"
            ) from None
        tied = set(getattr(self.model, "_tied_weights_keys", None) or ())
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {model_dir} does not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
