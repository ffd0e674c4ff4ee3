"""The studies find their config in an installed package, without the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mage_rl
from mage_rl.bench.study_configs import study_config
from mage_rl.config import TrainConfig, load_config

CHECKOUT = Path(mage_rl.__file__).resolve().parents[1]


def test_the_package_alone_finds_and_loads_the_config(tmp_path) -> None:
    # The package copied where no configs/ folder is near: what a wheel installs.
    site = tmp_path / "site"
    shutil.copytree(
        CHECKOUT / "mage_rl", site / "mage_rl", ignore=shutil.ignore_patterns("__pycache__")
    )
    code = "from mage_rl.bench.study_configs import study_config; print(study_config())"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.is_relative_to(site) and path.is_file()
    assert load_config(path, [], cls=TrainConfig).env.name == "kuhn_poker"


def test_the_checkout_config_is_the_shipped_one() -> None:
    assert (CHECKOUT / "configs" / "kuhn_adaptation_tiny.yaml").resolve() == study_config()


def test_a_missing_config_says_what_to_do() -> None:
    with pytest.raises(FileNotFoundError, match="kuhn_adaptation_tiny.yaml.*--config PATH"):
        study_config("nope.yaml")


def test_every_package_data_pattern_matches_a_file() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["package-data"]["mage_rl"]
    for pattern in patterns:
        assert list((CHECKOUT / "mage_rl").glob(pattern)), pattern
