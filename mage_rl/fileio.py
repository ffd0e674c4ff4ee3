"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the package writes for a later reader (run configs, checkpoint markers,
evaluation reports, rollout records) goes through :func:`atomic_write_text` or
:func:`atomic_write_json`: the content goes into a temporary sibling, is flushed to disk,
and ``os.replace`` renames it into place, which POSIX and Windows both make atomic within
one folder. A crash (or SIGKILL) at any moment leaves the previous file intact and at
worst a stray ``.NAME.*.tmp`` sibling, which the next write of that file replaces.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WRITE_FAILED_EXIT = 74
"""Exit status of a command stopped by a failed write (``EX_IOERR`` of sysexits.h): a
full disk, a read-only or vanished folder. Other failures exit with 1 (a crash) or 2 (a
refused command), Ctrl-C with 130."""

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# torch.save and safetensors do not raise OSError when a write comes up short.
_SHORT_WRITE = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
_NO_SPACE = ("No space left", "StorageFull", "os error 28", "code: 28", "Disk quota exceeded")
_IO = ("I/O error", "IoError", "os error")


class WriteError(OSError):
    """Writing a file failed; :attr:`disk_full` says whether the disk was full.

    Attributes:
        path: The file (or folder) being written.
        disk_full: The disk or the user's quota was full.
        cause: The exception the write raised.
    """

    def __init__(self, path: str | os.PathLike[str], cause: BaseException, disk_full: bool):
        self.path = Path(path)
        self.disk_full = disk_full
        self.cause = cause
        detail = str(cause).strip() or type(cause).__name__
        if disk_full:
            message = f"the disk is full: writing {self.path} failed ({detail})"
            free = _free_bytes(self.path)
            if free is not None:
                message += f"; {free / 2**20:.1f} MiB are free there now"
        else:
            message = f"writing {self.path} failed: {detail}"
        code = errno.ENOSPC if disk_full else getattr(cause, "errno", None) or errno.EIO
        super().__init__(code, message)

    def __str__(self) -> str:
        return str(self.args[1])


def write_error(exc: BaseException, path: str | os.PathLike[str]) -> WriteError | None:
    """``exc`` as a :class:`WriteError` if it is a failed write of ``path``, else ``None``.

    Any ``OSError`` is one (its own file name, when it has one, is kept); so is torch's
    ``RuntimeError`` for a short write (``[enforce fail at inline_container.cc:...]
    unexpected pos ...``, which is what a full disk looks like to ``torch.save``) and
    safetensors' error for an I/O failure.
    """
    if isinstance(exc, WriteError):
        return exc
    if isinstance(exc, OSError):
        where = exc.filename if isinstance(exc.filename, str | bytes | os.PathLike) else path
        return WriteError(os.fsdecode(where), exc, exc.errno in _FULL)
    text = str(exc)
    if isinstance(exc, RuntimeError) and any(s in text for s in _SHORT_WRITE):
        short = RuntimeError(f"torch.save wrote fewer bytes than it asked to: {text}")
        short.__cause__ = exc
        return WriteError(path, short, True)
    if type(exc).__name__ == "SafetensorError" and any(s in text for s in _IO):
        return WriteError(path, exc, any(s in text for s in _NO_SPACE))
    return None


@contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a failed write inside the block into a :class:`WriteError` for ``path``;
    other exceptions pass through as they are."""
    try:
        yield
    except Exception as exc:
        failure = write_error(exc, path)
        if failure is None or failure is exc:
            raise
        raise failure from exc


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


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
