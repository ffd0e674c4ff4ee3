"""Test-wide set-up: OpenRLHF's modules importable on a CPU; caches kept out of home.

OpenRLHF imports flash-attn (a CUDA build) at module import time. When the real
flash-attn is missing, ``_shims/flash_attn`` goes on ``sys.path`` for every test that
imports OpenRLHF, the cluster tests and the loss comparison in ``tests/rl`` alike, so
each passes whether it runs alone or in the whole suite.

What the package caches (the solved Kuhn CFR table, converted checkpoints) goes to one
temporary folder per test session, never to the user's ``~/.cache/mage-rl``.

Torch runs on one thread, in this process and in the ones tests start: the test models
gain nothing from a second one, and on a machine whose CPUs other processes keep busy,
OpenMP's barrier waits make every forward pass several times slower. Tests about thread
counts set their own and put this one back.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mage_rl.cache import CACHE_ENV

if importlib.util.find_spec("flash_attn") is None:
    sys.path.insert(0, str(Path(__file__).parent / "_shims"))


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``$MAGE_RL_CACHE`` for the whole session (subprocesses and Ray workers inherit it)."""
    root = tmp_path_factory.mktemp("mage-rl-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the session; ``OMP_NUM_THREADS`` carries it to subprocesses."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


KUHN_TINY = Path(__file__).parents[1] / "configs" / "kuhn_tiny.yaml"


@pytest.fixture(scope="session")
def kuhn_tiny_run(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """``mage train configs/kuhn_tiny.yaml`` for two iterations on the local backend.

    The CLI tests read it and the Ray backend tests compare their run with it. It is
    shared, by the tests of one process and by pytest-xdist's worker processes (the
    first to need it trains it under a file lock, the others wait and read it): a test
    that would change it (a resume) works on a copy.
    """
    from filelock import FileLock

    from mage_rl.cli import main

    root = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # the workers' folders share their parent
        root = root.parent
    run = root / "shared-runs" / "kuhn_tiny"
    done = run.with_name("kuhn_tiny.done")
    run.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(run.with_name("kuhn_tiny.lock"))):
        if not done.exists():
            if run.exists():  # a worker that failed midway left it
                shutil.rmtree(run)
            overrides = ["train.iterations=2", "eval.tasks=2"]
            args = ["train", str(KUHN_TINY), "--run-dir", str(run), "--no-progress"]
            assert main(args + [a for o in overrides for a in ("--set", o)]) == 0
            done.touch()
    return run


# The modules whose tests take 5 s or more (see `--durations`), started first: pytest-xdist
# hands out tests in collection order, and a long test handed out last keeps one worker
# busy while the other has nothing left to do.
LONG_MODULES = (
    "tests/studies/test_adaptation.py",
    "tests/test_plugins.py",
    "tests/train/test_new_game_configs.py",
    "tests/train/test_train_cli.py",
    "tests/train/test_phases.py",
    "tests/serve/test_shutdown_keys.py",
    "tests/graphs/test_tracing.py",
    "tests/cluster/test_core_without_cluster_stack.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of :data:`LONG_MODULES` first, each part in its collection order."""
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in LONG_MODULES)
