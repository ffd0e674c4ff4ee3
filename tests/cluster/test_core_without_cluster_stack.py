"""The core never imports the cluster stack; without it, the backends say what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mage_rl.config import TrainConfig, load_config

CONFIG = Path(__file__).parents[2] / "configs" / "kuhn_tiny.yaml"
STACK = ("ray", "openrlhf", "deepspeed", "vllm", "flash_attn")


def test_importing_every_module_loads_no_cluster_package() -> None:
    code = (
        "import sys\n"
        "import mage_rl, mage_rl.cli, mage_rl.config, mage_rl.runtime, mage_rl.rl.trainer\n"
        "import mage_rl.cluster.backends, mage_rl.cluster.ray_backend\n"
        "import mage_rl.cluster.openrlhf_backend, mage_rl.cluster.openrlhf_args\n"
        "import mage_rl.cluster.experience, mage_rl.cluster.vllm_policy, mage_rl.cluster.standin\n"
        f"print(sorted(m for m in {STACK!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ray_backend_without_ray_says_what_to_install(monkeypatch, tmp_path: Path) -> None:
    from mage_rl.cluster.ray_backend import RayTrainer

    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    cfg = load_config(CONFIG, [], TrainConfig)
    with pytest.raises(ImportError, match=r"pip install 'ray==2\.55\.0'"):
        RayTrainer(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
