"""The configs the learning studies start from, shipped inside the package.

``mage bench adaptation`` and ``mage bench identification`` default to
``kuhn_adaptation_tiny.yaml``. It lives in ``mage_rl/bench/configs/`` (package data, so an
installed ``mage`` finds it without a checkout); ``configs/kuhn_adaptation_tiny.yaml`` in
a checkout is a link to the same file, so there is one copy to edit.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().with_name("configs")
"""Folder of the shipped study configs."""

ADAPTATION_CONFIG = "kuhn_adaptation_tiny.yaml"
"""The default config of both studies: Kuhn Poker, fresh deals, history, a tiny Qwen3."""


def study_config(name: str = ADAPTATION_CONFIG) -> Path:
    """The path of a shipped study config.

    Raises:
        FileNotFoundError: If the package was installed without its configs.
    """
    path = CONFIG_DIR / name
    if not path.is_file():
        shipped = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(
            f"no study config {name!r} in {CONFIG_DIR} (shipped: {shipped or 'none'}); "
            "reinstall mage-rl, or pass --config PATH"
        )
    return path
