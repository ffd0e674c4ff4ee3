"""mage-rl: train LLM agents with MAGE, evaluate them, serve them.

What a Python user needs is importable from here (see :mod:`mage_rl.api`)::

    from mage_rl import evaluate, load_agent, load_config, train

The names load on first use, so importing the package stays fast.
"""

from __future__ import annotations

from typing import Any

from mage_rl import api

__all__ = ["TrainedAgent", "evaluate", "load_agent", "load_config", "train"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(api, name)
    raise AttributeError(f"module 'mage_rl' has no attribute {name!r}")
