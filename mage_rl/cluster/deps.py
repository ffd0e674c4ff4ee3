"""Lazy imports of the optional distributed stack, with errors that say what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

# What each optional module needs; the `cluster` extra pins the versions OpenRLHF 0.11 wants.
_HINTS = {
    "ray": "pip install 'ray==2.55.0' (or pip install 'mage-rl[cluster]')",
    "openrlhf": "pip install 'mage-rl[cluster]' on a CUDA machine (see docs/cluster.md)",
    "deepspeed": "pip install 'mage-rl[cluster]' on a CUDA machine (see docs/cluster.md)",
    "vllm": "pip install 'mage-rl[cluster]' on a CUDA machine (see docs/cluster.md)",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise an ``ImportError`` that names the fix.

    Args:
        module: Dotted module name, e.g. ``"ray"`` or ``"openrlhf.trainer.ppo_utils"``.
        purpose: What needs it, for the message (e.g. ``"train.backend=ray"``).

    Raises:
        ImportError: The module (or one of its own imports) is missing.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        top = module.split(".")[0]
        hint = _HINTS.get(top, f"pip install {top}")
        raise ImportError(f"{purpose} needs {module} ({err}); install it with: {hint}") from err
