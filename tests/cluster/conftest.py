"""Make OpenRLHF's model code importable on a CPU (see _shims/flash_attn)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("flash_attn") is None:
    sys.path.insert(0, str(Path(__file__).parent / "_shims"))
