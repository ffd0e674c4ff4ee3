"""A training run's folder: when a run exists, what a resume may change, old checkpoints.

Rules (docs/training.md, "Checkpoints, resume, interruption"):

1. A checkpoint ``checkpoints/iter_NNNNNN/`` is *complete* once its ``trainer_state.json``
   is written, which is the last thing a save does (the file goes in atomically).
2. A run *exists* in a folder when the folder holds a complete checkpoint: exactly when
   ``--resume`` has something to continue. A folder left by a start that stopped before
   its first checkpoint (a kill, or a crash) is not a run; the same command starts over
   in it, and iterations it logged are dropped from ``metrics.jsonl``, because nothing
   can continue them.
3. A resumed run may change only the settings listed in :data:`RESUMABLE_KEYS` (length,
   checkpoint cadence, evaluation, batching of the engine); everything else is fixed by
   the checkpoint (weights, optimizer state, the task stream) and a change is refused.
4. Old checkpoints are retired by a rename out of the ``iter_`` namespace first
   (``.retired-iter_NNNNNN``), then deleted, so a kill mid-deletion never leaves a folder
   that :func:`latest_checkpoint` could count.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from mage_rl.fileio import atomic_write_text
from mage_rl.plugins import ENV_VAR

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
MODEL_DIR = "model"
"""The servable model of a checkpoint: ``checkpoints/iter_NNNNNN/model``."""
CONFIG_FILE = "config.yaml"
RETIRED_PREFIX = ".retired-"
_CHECKPOINT = re.compile(r"iter_(\d+)")

RESUMABLE_KEYS: tuple[str, ...] = (
    "train.iterations",
    "train.save_every",
    "train.keep_checkpoints",
    "train.save_samples",
    "train.out_dir",
    "train.run_name",
    "train.ray_address",
    "train.num_workers",
    "rollout.concurrency",
    "policy.max_batch_size",
    "eval.",
)
"""Config keys (or ``section.`` prefixes) a ``--resume`` may change: none of them is part
of a checkpoint, and none changes the samples a run draws (rollouts are seeded per
meta-episode, so the engine's batching does not matter)."""


def checkpoint_name(iteration: int) -> str:
    """``iter_000012`` for iteration 12."""
    return f"iter_{iteration:06d}"


def checkpoint_iteration(path: Path) -> int | None:
    """The iteration of a checkpoint folder name (``iter_000012`` -> 12), else ``None``."""
    match = _CHECKPOINT.fullmatch(path.name)
    return int(match.group(1)) if match else None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint (its ``trainer_state.json`` written), or ``None``."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = [
        p
        for p in root.iterdir()
        if checkpoint_iteration(p) is not None and (p / STATE_FILE).is_file()
    ]
    return max(done, key=lambda p: checkpoint_iteration(p) or 0, default=None)


def find_run(model: str) -> tuple[Path, Path] | None:
    """``(run folder, model folder)`` when ``model`` names a training run, else ``None``.

    A run folder (it holds ``config.yaml`` or ``checkpoints/``) means its newest complete
    checkpoint;
    ``RUN/checkpoints/iter_N`` and ``RUN/checkpoints/iter_N/model`` mean that checkpoint.

    Raises:
        ValueError: A run folder with no complete checkpoint yet.
    """
    if model.startswith(("http://", "https://")):
        return None
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    if (path / CONFIG_FILE).is_file() or (path / "checkpoints").is_dir():
        checkpoint = latest_checkpoint(path)
        if checkpoint is None:
            raise ValueError(
                f"{path} is a training run with no complete checkpoint yet; evaluate it "
                "after its first checkpoint, or name a model folder"
            )
        return path, checkpoint / MODEL_DIR
    candidates = [(path, path / MODEL_DIR)]
    if path.name == MODEL_DIR:
        candidates.append((path.parent, path))
    for checkpoint, model_dir in candidates:
        run = checkpoint.parent.parent
        if (
            checkpoint_iteration(checkpoint) is not None
            and checkpoint.parent.name == "checkpoints"
            and (run / CONFIG_FILE).is_file()
            and model_dir.is_dir()
        ):
            return run, model_dir
    return None


def start_checkpoint(run_dir: Path, resume: bool) -> Path | None:
    """Decide how a run starts in ``run_dir`` (rule 2), touching nothing.

    Returns:
        The checkpoint to resume from, or ``None`` to start from iteration 0.

    Raises:
        FileExistsError: A fresh start over a folder that holds a run.
        FileNotFoundError: ``--resume`` where no run was ever started.
    """
    checkpoint = latest_checkpoint(run_dir)
    if not resume:
        if checkpoint is not None:
            raise FileExistsError(
                f"{run_dir} already holds a run (checkpoint {checkpoint.name}); pass --resume "
                "to continue it, or choose another train.run_name or --run-dir"
            )
        if (run_dir / CONFIG_FILE).exists():
            logger.warning(
                "%s holds no complete checkpoint (an earlier start stopped before its "
                "first one): starting over in it",
                run_dir,
            )
        return None
    if checkpoint is None:
        if not (run_dir / CONFIG_FILE).exists():
            raise FileNotFoundError(
                f"--resume: {run_dir} holds no run to resume; start it without --resume "
                "(or point --run-dir at the run folder)"
            )
        logger.warning(
            "--resume: %s holds no complete checkpoint yet; starting from iteration 0", run_dir
        )
    return checkpoint


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE_KEYS)


def check_resume_config(run_dir: Path, new: dict[str, Any], checkpoint: Path) -> None:
    """Refuse a resume whose config changes what the checkpoint fixes (rule 3).

    Args:
        run_dir: The run folder, whose ``config.yaml`` is the saved config.
        new: The new config, as ``TrainConfig.model_dump(mode="json")``.
        checkpoint: The checkpoint being resumed (named in the message).

    Raises:
        ValueError: Naming each changed key with its saved and new value, and the fix.
    """
    saved_path = run_dir / CONFIG_FILE
    if not saved_path.exists():
        logger.warning("%s has no %s; cannot check the resumed config", run_dir, CONFIG_FILE)
        return
    saved = _flatten(yaml.safe_load(saved_path.read_text()) or {})
    fresh = _flatten(recorded_config(new))
    # Keys the saved file lacks come from a newer version of this package: compared only
    # when both sides have them.
    changed = [
        f"{key} (saved {saved[key]!r}, now {fresh[key]!r})"
        for key in sorted(set(saved) & set(fresh))
        if saved[key] != fresh[key] and not _resumable(key)
    ]
    if changed:
        allowed = ", ".join(k + "*" if k.endswith(".") else k for k in RESUMABLE_KEYS)
        raise ValueError(
            f"--resume: the config differs from the run's saved {saved_path} in settings the "
            f"checkpoint {checkpoint.name} fixes (weights, optimizer state, task stream):\n  "
            + "\n  ".join(changed)
            + f"\nPut the saved values back to resume, or start a new run from this "
            f"checkpoint's weights: --set policy.model={checkpoint / 'model'} with another "
            f"--run-dir. A resume may change only: {allowed}."
        )


def recorded_config(data: dict[str, Any]) -> dict[str, Any]:
    """A config as its run folder records it: ``plugins`` lists also those this process
    loaded from ``--plugin`` or ``$MAGE_RL_PLUGINS``, so the folder names what it needs
    (``mage eval`` and ``mage serve`` load them from there)."""
    plugins = list(data.get("plugins") or [])
    loaded = [p for p in os.environ.get(ENV_VAR, "").split(os.pathsep) if p]
    return {**data, "plugins": plugins + [p for p in loaded if p not in plugins]}


def resume_command(
    config: str | Path, run_dir: Path, overrides: Sequence[str] = (), backend: str | None = None
) -> str:
    """The command that carries on a stopped run, to print when it stops: ``--resume``
    when the folder holds a complete checkpoint (else the same start, which starts over
    in the folder), with the run's ``--set`` overrides, which a resume must repeat."""
    command = ["mage", "train", str(config)]
    for item in overrides:
        command += ["--set", item]
    if backend:
        command += ["--backend", backend]
    if latest_checkpoint(run_dir) is not None:
        command.append("--resume")
    return shlex.join([*command, "--run-dir", str(run_dir)])


def write_run_config(run_dir: Path, data: dict[str, Any]) -> None:
    """Write ``config.yaml`` (atomically) once the config has passed every check, with
    the plugins the process loaded (:func:`recorded_config`)."""
    text = yaml.safe_dump(recorded_config(data), sort_keys=False)
    atomic_write_text(run_dir / CONFIG_FILE, text)


def clear_retired(root: Path) -> None:
    """Finish deleting checkpoints whose retirement a kill interrupted."""
    if root.is_dir():
        for leftover in root.glob(RETIRED_PREFIX + "*"):
            shutil.rmtree(leftover, ignore_errors=True)


def retire_checkpoints(
    root: Path, saved: int, keep: int, companions: Sequence[str] = ()
) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints up to ``saved`` (rule 4).

    Folders numbered above ``saved`` (left by an abandoned stretch of a run that resumed
    from an earlier checkpoint) and incomplete ones go too.

    Args:
        root: The ``checkpoints/`` folder.
        saved: The iteration just saved; its checkpoint is always kept.
        keep: How many complete checkpoints to keep (``train.keep_checkpoints``).
        companions: Name suffixes of sibling folders that belong to a checkpoint
            (``"_hf"`` for ``iter_NNNNNN_hf``), retired after it.

    Returns:
        The checkpoint folders retired.
    """
    folders = sorted(
        (p for p in root.iterdir() if checkpoint_iteration(p) is not None),
        key=lambda p: checkpoint_iteration(p) or 0,
    )
    complete = [
        p for p in folders if (checkpoint_iteration(p) or 0) <= saved and (p / STATE_FILE).is_file()
    ]
    kept = set(complete[-keep:])
    retired = [p for p in folders if p not in kept and checkpoint_iteration(p) != saved]
    for old in retired:
        # The rename takes the folder out of the iter_ namespace in one atomic step; only
        # then is it deleted, which may take long and be interrupted.
        parts = [old, *(old.with_name(old.name + s) for s in companions)]
        moved = []
        for part in parts:
            if part.exists():
                target = part.with_name(RETIRED_PREFIX + part.name)
                if target.exists():  # left by a retirement a kill interrupted
                    shutil.rmtree(target, ignore_errors=True)
                part.rename(target)
                moved.append(target)
        for target in moved:
            shutil.rmtree(target, ignore_errors=True)
    return retired
