"""Atomic writes: a failed write leaves the old file whole and no temporary file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mage_rl.fileio import atomic_write_json, atomic_write_lines, atomic_write_text


def test_text_json_and_lines_land_whole(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "folder" / "a.json"
    atomic_write_json(target, {"b": 1, "a": [1, 2]}, indent=None, sort_keys=True)
    assert target.read_text() == '{"a": [1, 2], "b": 1}\n'
    atomic_write_text(target, "plain", fsync=False)
    assert target.read_text() == "plain"
    atomic_write_lines(target, (f"{i}\n" for i in range(3)))
    assert target.read_text() == "0\n1\n2\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.json"]


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    atomic_write_json(target, {"iteration": 1})

    def lines():
        yield '{"iteration": '
        raise RuntimeError("stopped mid-write")

    with pytest.raises(RuntimeError):
        atomic_write_lines(target, lines())
    assert json.loads(target.read_text()) == {"iteration": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_unserialisable_json_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    with pytest.raises(TypeError):
        atomic_write_json(target, {"x": object()})
    assert not list(tmp_path.iterdir())
    atomic_write_json(target, {"x": object()}, default=lambda _o: "obj")
    assert json.loads(target.read_text()) == {"x": "obj"}
