"""The studies' config is where the checkout says, and the studies are not packaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from mage_rl import load_config
from studies.adaptation import CONFIG

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_checkout_config_is_the_study_config() -> None:
    # configs/kuhn_adaptation_tiny.yaml links to the study's copy: one file to edit.
    assert (CHECKOUT / "configs" / "kuhn_adaptation_tiny.yaml").resolve() == CONFIG
    assert CONFIG.parent == CHECKOUT / "studies" / "adaptation"
    assert load_config(CONFIG).env.name == "kuhn_poker"


def test_the_package_holds_neither_the_studies_nor_their_config() -> None:
    tomllib = pytest.importorskip("tomllib")
    from setuptools import find_packages

    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    find = project["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(CHECKOUT), include=find["include"])
    assert "mage_rl" in packages and "mage_rl.bench" in packages
    assert not [p for p in packages if not p.startswith("mage_rl")]
    for pattern in project["tool"]["setuptools"]["package-data"]["mage_rl"]:
        found = list((CHECKOUT / "mage_rl").glob(pattern))
        assert found, pattern  # every package-data pattern matches a file
        assert not [f for f in found if f.suffix == ".yaml"]
