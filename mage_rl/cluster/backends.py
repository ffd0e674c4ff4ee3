"""Pick the trainer class of a ``train.backend`` without importing the others."""

from __future__ import annotations

from typing import Any


def trainer_class(backend: str) -> Any:
    """The trainer class for ``train.backend`` (``local``, ``ray`` or ``openrlhf``).

    All three take ``(cfg, run_dir, resume=..., progress=...)`` and have ``run()``.
    """
    if backend == "local":
        from mage_rl.rl.trainer import Trainer

        return Trainer
    if backend == "ray":
        from mage_rl.cluster.ray_backend import RayTrainer

        return RayTrainer
    if backend == "openrlhf":
        from mage_rl.cluster.openrlhf_backend import OpenRLHFTrainer

        return OpenRLHFTrainer
    raise ValueError(f"unknown train.backend {backend!r}; use local, ray or openrlhf")
