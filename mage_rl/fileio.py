"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the package writes for a later reader (run configs, checkpoint markers,
evaluation reports, rollout records) goes through :func:`atomic_write_text` or
:func:`atomic_write_json`: the content goes into a temporary sibling, is flushed to disk,
and ``os.replace`` renames it into place, which POSIX and Windows both make atomic within
one folder. A crash (or SIGKILL) at any moment leaves the previous file intact and at
worst a stray ``.NAME.*.tmp`` sibling, which the next write of that file replaces.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _tmp_name(path: Path) -> Path:
    # Hidden, and named after the target so a leftover says which write it belonged to;
    # the pid keeps two processes writing the same file from sharing a temp file.
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _fsync_dir(folder: Path) -> None:
    # The rename itself lives in the folder's entry table; without this a power cut can
    # lose it even though the file's data reached the disk. Not every OS allows it.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_lines(
    path: str | os.PathLike[str], lines: Iterable[str], fsync: bool = True
) -> Path:
    """Write ``lines`` (each written as given, newlines included) to ``path`` atomically.

    Args:
        path: The file to (re)place; its folder is created if missing.
        lines: The text, in pieces, so large files need not be joined in memory first.
        fsync: Flush the data and the rename to disk before returning (what makes a
            checkpoint marker trustworthy after a power cut); off for files that are
            cheap to make again.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(target)
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for line in lines:
                f.write(line)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(target.parent)
    return target


def atomic_write_text(path: str | os.PathLike[str], text: str, fsync: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write_lines`)."""
    return atomic_write_lines(path, [text], fsync=fsync)


def atomic_write_json(
    path: str | os.PathLike[str],
    data: Any,
    indent: int | None = 2,
    fsync: bool = True,
    **dumps: Any,
) -> Path:
    """Write ``data`` as JSON (with a final newline) to ``path`` atomically.

    Args:
        path: The file to (re)place.
        data: Anything ``json.dumps`` accepts with ``dumps`` (e.g. ``default=str``).
        indent: JSON indentation; ``None`` writes one line.
        fsync: As in :func:`atomic_write_lines`.
        **dumps: Further keyword arguments of ``json.dumps``.
    """
    return atomic_write_text(path, json.dumps(data, indent=indent, **dumps) + "\n", fsync=fsync)
