"""Where mage-rl keeps what it computes once: solved CFR tables, converted checkpoints.

One root for every cache: ``$MAGE_RL_CACHE`` when set (tests point it at a temporary
folder), else ``~/.cache/mage-rl``.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "MAGE_RL_CACHE"
"""Environment variable that moves the cache."""

DEFAULT_CACHE = "~/.cache/mage-rl"


def cache_root(override: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: ``override``, else ``$MAGE_RL_CACHE``, else ``~/.cache/mage-rl``.

    An empty ``$MAGE_RL_CACHE`` counts as unset (it would otherwise mean the current
    folder). The folder is not created here; writers create what they write.
    """
    chosen = override if override is not None else os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser()
