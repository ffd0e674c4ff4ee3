"""Real vLLM servers on this machine's CPU (``-m vllm``), started from ``.venv-vllm``.

Every test here is marked ``vllm`` (``pytestmark = VLLM``): the default run deselects them (they take minutes),
``.ci/run`` runs them with ``pytest -m vllm -n 0`` (one server at a time), and they skip, saying how to install vLLM,
where no Python with vLLM is found. The model is SmolLM2-135M from its cached HF
conversion, in fp32 so that the server's log-probs can be compared with the local model's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from mage_rl.policy.vllm_engine import (
    VLLM_ARGS_ENV,
    VLLM_INSTALL_HINT,
    VLLMEngine,
    find_vllm_python,
)

MODEL = "smollm2"


# Every module here sets ``pytestmark = VLLM``.
VLLM = [
    pytest.mark.vllm,
    pytest.mark.skipif(find_vllm_python() is None, reason=f"no vLLM: {VLLM_INSTALL_HINT}"),
]


@pytest.fixture(scope="package", autouse=True)
def eager_vllm() -> Iterator[None]:
    """Servers skip torch compilation: it takes minutes on a small CPU, and these tests
    check what is sampled, not how fast (``mage bench vllm`` runs compiled)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(VLLM_ARGS_ENV, os.environ.get(VLLM_ARGS_ENV, "--enforce-eager"))
        yield


@pytest.fixture(scope="package")
def smollm2_fp32():
    from mage_rl.policy.models import load_model

    return load_model(MODEL, dtype="fp32")


@pytest.fixture(scope="package")
def engine() -> Iterator[VLLMEngine]:
    """One fp32 SmolLM2 server for the package (starting one takes a minute here)."""
    with VLLMEngine(MODEL, dtype="fp32", max_batch_size=16, name=MODEL) as started:
        yield started
