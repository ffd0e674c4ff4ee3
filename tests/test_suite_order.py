"""The suite's scheduling list names modules that exist (a renamed module would silently
lose its early start)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONG_MODULES

ROOT = Path(__file__).parents[1]


def test_long_modules_exist() -> None:
    assert [m for m in LONG_MODULES if not (ROOT / m).is_file()] == []
