"""Where agent sessions live between requests and across restarts: one log per session.

A session's log is a JSON-lines file, ``<key>.jsonl`` (the key is the SHA-256 of the
session's handle, :mod:`mage_rl.serve.handles`): a header line (the agent that plays it,
its owner, label and sampling), then one line per message the agent answered, holding
the message and every model call it made in answer (:mod:`mage_rl.serve.replay`). Each
line is appended and ``fsync`` ed before the client gets its answer. A server killed
while writing leaves at most one torn last line, which the next load cuts off: the
session is then as it was before that message, which the client will send again.

The header is written to a temporary file and renamed into place, so a log exists
whole or not at all. The directory also holds ``secret``, the key of the owners' HMACs,
and is created readable by its owner alone (mode 0700).

Without a directory (``root=None``) the logs stay in memory: sessions survive their
errors but not a restart.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

_LOG = re.compile(r"[0-9a-f]{64}\.jsonl")


class SessionStore:
    """The logs of one server's sessions (see the module docstring).

    Args:
        root: The state directory, or ``None`` to keep the logs in memory.

    Raises:
        OSError: The directory cannot be created or written.
    """

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._memory: dict[str, list[str]] = {}
        if root is None:
            self.secret = secrets.token_bytes(32)
            return
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.secret = self._load_secret(root / "secret")

    # -- writing ------------------------------------------------------------------------

    def create(self, key: str, header: dict[str, Any]) -> None:
        """Start the log of a new session with its header."""
        line = _line(header)
        if self.root is None:
            self._memory[key] = [line]
            return
        _write_atomically(self._path(key), line.encode())

    def append(self, key: str, entry: dict[str, Any]) -> None:
        """Add one answered message to a session's log, durably."""
        line = _line(entry)
        if self.root is None:
            self._memory[key].append(line)
            return
        with open(self._path(key), "ab") as file:
            file.write(line.encode())
            file.flush()
            os.fsync(file.fileno())

    def remove(self, key: str) -> None:
        if self.root is None:
            self._memory.pop(key, None)
            return
        self._path(key).unlink(missing_ok=True)

    # -- reading ------------------------------------------------------------------------

    def load(self, key: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """A session's header and answered messages, or ``None`` if it has no log.

        A torn last line (a write the server did not finish) is cut off the file.

        Raises:
            ValueError: The header cannot be read.
        """
        if self.root is None:
            lines = self._memory.get(key)
            if lines is None:
                return None
            return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
        path = self._path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        lines = raw.split(b"\n")
        header = json.loads(lines[0])
        entries, good = [], len(lines[0]) + 1
        for line in lines[1:-1]:  # the part after the last newline is torn or empty
            try:
                entries.append(json.loads(line))
            except ValueError:
                break
            good += len(line) + 1
        if good < len(raw):
            with open(path, "r+b") as file:
                file.truncate(good)
                os.fsync(file.fileno())
        return header, entries

    def logs(self) -> list[tuple[str, float]]:
        """Every session's key and the wall-clock time its log last changed."""
        if self.root is None:
            return []
        out = []
        for path in self.root.iterdir():
            if _LOG.fullmatch(path.name):
                out.append((path.name.removesuffix(".jsonl"), path.stat().st_mtime))
        return out

    def header(self, key: str) -> dict[str, Any] | None:
        """The header of a session's log alone (``None`` when there is none)."""
        if self.root is None:
            lines = self._memory.get(key)
            return json.loads(lines[0]) if lines else None
        try:
            with open(self._path(key), "rb") as file:
                return json.loads(file.readline())  # type: ignore[no-any-return]
        except (FileNotFoundError, ValueError):
            return None

    # -- helpers ------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / f"{key}.jsonl"

    @staticmethod
    def _load_secret(path: Path) -> bytes:
        if path.is_file():
            data = path.read_bytes()
            if len(data) == 32:
                return data
        data = secrets.token_bytes(32)
        _write_atomically(path, data)
        return data


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file readable by its owner alone, sync it, and rename
    it into place (then sync the directory, so the rename survives a crash)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
