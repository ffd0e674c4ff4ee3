"""Where a results file came from: one writer for every benchmark and evaluation result.

Learning curves on a CPU change with the number of torch threads (a different reduction
order changes the last bits of every update, and the runs drift apart after a few dozen
iterations), and throughput changes with the machine. A result is only reproducible when
the file says what produced it, so every results JSON of ``mage bench`` and ``mage eval``
is written by :func:`write_results`, which adds a ``provenance`` block:

* ``commit``: ``git rev-parse HEAD`` of the checkout the package runs from, with
  ``dirty`` when tracked files differ from it; ``"unknown"`` for an installed package
  (no checkout around it). It is read when the command starts (:func:`mark_start`, which
  ``mage`` and the Python API call first), so a run that outlives a commit says what it
  ran; ``commit_at_write`` is added when the checkout moved on before the file was
  written;
* ``versions``: mage-rl, Python and the libraries that change results (torch,
  transformers, open_spiel, langgraph, numpy, ray when installed);
* ``threads``: torch's intra-op and inter-op thread counts and the thread variables of
  the environment (``OMP_NUM_THREADS``...), ``cpu_count`` and ``cpu_model``;
* ``command``: the command line; ``started_at``, ``written_at`` and ``wall_seconds``.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from mage_rl.fileio import atomic_write_json

PROVENANCE_KEY = "provenance"
"""Key of the provenance block in a results document."""

PACKAGES = ("mage-rl", "torch", "transformers", "open_spiel", "langgraph", "numpy", "ray")
"""Distributions whose versions are recorded (missing ones are recorded as ``None``)."""

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""Environment variables that set the thread pools of torch's kernels."""

# When nobody says when the command started, the interpreter's start is the next best:
# for a `mage` command the two differ by the import time only.
_IMPORTED = time.time()
_START_COMMIT: dict[str, Any] | None = None


def mark_start() -> None:
    """Read the checkout's commit now, at the start of a command: results files written
    later by this process carry it (and say so when the checkout has moved on). Only the
    first call counts."""
    global _START_COMMIT
    if _START_COMMIT is None:
        _START_COMMIT = git_commit()


def git_commit(where: str | Path | None = None) -> dict[str, Any]:
    """The commit of the checkout that holds the ``mage_rl`` package.

    Only a checkout whose top folder is the package's parent counts: an installed
    package sitting in some other repository (a virtual environment inside a project)
    reports ``"unknown"``, not that project's commit.

    Args:
        where: The folder to ask (default: the one that holds ``mage_rl/``).

    Returns:
        ``{"commit": SHA or "unknown", "dirty": bool or None}``.
    """
    root = Path(where) if where is not None else Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None  # no git on this machine
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return {"commit": "unknown", "dirty": None}
    commit = git("rev-parse", "HEAD") or "unknown"
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of ``names`` (``None`` for one that is not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def thread_settings() -> dict[str, Any]:
    """Torch's thread counts now, and the environment variables that set them."""
    import torch

    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        **{name: os.environ.get(name) for name in THREAD_VARIABLES},
    }


def provenance(
    *, started: float | None = None, argv: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    """The provenance block of a results file written now.

    Args:
        started: ``time.time()`` when the command began (default: when this module was
            first imported, which for a ``mage`` command is its start).
        argv: The command line (default: ``sys.argv``).
        **extra: More fields (e.g. the ``threads`` a benchmark was asked for).
    """
    now = time.time()
    begin = _IMPORTED if started is None else started
    command = list(sys.argv if argv is None else argv)
    if command and Path(command[0]).name in ("mage", "__main__.py", "cli.py"):
        command[0] = "mage"
    now_commit = git_commit()
    commit = dict(_START_COMMIT or now_commit)
    if now_commit != commit:
        commit["commit_at_write"] = now_commit
    return {
        **commit,
        "versions": package_versions(),
        **thread_settings(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "command": shlex.join(command),
        "started_at": _iso(begin),
        "written_at": _iso(now),
        "wall_seconds": round(now - begin, 1),
        **extra,
    }


def write_results(
    path: str | Path,
    doc: dict[str, Any],
    *,
    started: float | None = None,
    argv: list[str] | None = None,
    indent: int = 2,
    **extra: Any,
) -> Path:
    """Write a results document as JSON with its provenance block, atomically.

    The folder is created if needed; the file is written to a temporary sibling and
    renamed into place, so a reader never sees half a file. ``doc`` itself gets the
    same ``provenance`` key, so a caller that keeps the document keeps the stamp.

    Args:
        path: The results file.
        doc: The results (any JSON-able mapping; other values are written with ``str``).
        started: See :func:`provenance`.
        argv: See :func:`provenance`.
        indent: JSON indentation.
        **extra: More provenance fields.

    Returns:
        The path written.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    doc[PROVENANCE_KEY] = provenance(started=started, argv=argv, **extra)
    return atomic_write_json(target, doc, indent=indent, default=str)


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat(timespec="seconds")
