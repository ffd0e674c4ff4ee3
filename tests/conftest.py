"""Test-wide set-up: OpenRLHF's modules importable on a CPU.

OpenRLHF imports flash-attn (a CUDA build) at module import time. When the real
flash-attn is missing, ``_shims/flash_attn`` goes on ``sys.path`` for every test that
imports OpenRLHF, the cluster tests and the loss comparison in ``tests/rl`` alike, so
each passes whether it runs alone or in the whole suite.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("flash_attn") is None:
    sys.path.insert(0, str(Path(__file__).parent / "_shims"))
