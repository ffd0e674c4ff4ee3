"""One cache root for the package, and the tests keep it out of the home folder."""

from __future__ import annotations

import os
from pathlib import Path

from mage_rl.cache import CACHE_ENV, cache_root


def test_tests_cache_in_a_temporary_folder(session_cache: Path) -> None:
    assert cache_root() == session_cache
    assert not session_cache.is_relative_to(Path.home() / ".cache")


def test_the_root_follows_the_override_then_the_variable_then_home(monkeypatch) -> None:
    assert cache_root("~/x") == Path.home() / "x"
    monkeypatch.setenv(CACHE_ENV, "/tmp/c")
    assert cache_root() == Path("/tmp/c")
    monkeypatch.setenv(CACHE_ENV, "")  # empty is unset, not the current folder
    assert cache_root() == Path.home() / ".cache" / "mage-rl"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == Path(os.path.expanduser("~/.cache/mage-rl"))


def test_the_kuhn_cfr_table_is_cached_under_the_root(session_cache: Path) -> None:
    from mage_rl.envs.kuhn import cache_dir

    assert cache_dir() == session_cache
