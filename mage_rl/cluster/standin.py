"""A stand-in for OpenRLHF's vLLM engine actor that runs the local engine.

vLLM needs a GPU. To exercise the cluster rollout path on a CPU (tests, debugging a
graph before a cluster run), :class:`LocalVLLMEngine` follows the contract MAGE uses of
OpenRLHF's ``RolloutRayActor``:

- ``async generate(prompt_token_ids, sampling_params, multi_modal_data=None)`` returns an
  object shaped like vLLM's ``RequestOutput``: ``.prompt_token_ids`` and ``.outputs[0]``
  with ``.token_ids``, ``.text``, ``.finish_reason`` (``"stop"``/``"length"``) and
  ``.logprobs``, one ``{token_id: Logprob}`` dict per response token when
  ``sampling_params.logprobs`` is set, else ``None``;
- ``sampling_params`` is read by attribute, as vLLM's ``SamplingParams``: ``temperature``,
  ``top_p``, ``top_k`` (``-1`` or ``0`` disable it), ``max_tokens``, ``stop``, ``seed``,
  ``logprobs``;
- ``get_num_unfinished_requests()``.

Underneath it is a :class:`~mage_rl.policy.engine.LocalEngine`, so the tokens and
log-probs are real samples of the model. It can run in-process or as a Ray actor
(``ray.remote(LocalVLLMEngine)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from mage_rl.policy.base import SamplingParams


@dataclass
class Logprob:
    """vLLM's ``Logprob``: the log-probability of one token."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """vLLM's ``CompletionOutput``: one sampled response."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """vLLM's ``RequestOutput``: the prompt and its completions."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


def sampling_params_namespace(**kwargs: Any) -> SimpleNamespace:
    """An attribute bag with vLLM ``SamplingParams``' defaults, for engines without vLLM."""
    defaults: dict[str, Any] = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 16,
        "stop": None,
        "seed": None,
        "logprobs": None,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }
    unknown = set(kwargs) - set(defaults)
    if unknown:
        raise TypeError(f"unknown sampling parameter(s) {sorted(unknown)}")
    return SimpleNamespace(**{**defaults, **kwargs})


class LocalVLLMEngine:
    """vLLM's token-level ``generate`` contract over a :class:`LocalEngine`.

    Args:
        engine: A ready :class:`~mage_rl.policy.engine.LocalEngine`; or ``None`` with
            ``model`` set, to build one (the form a Ray actor takes).
        model: Model spec for :func:`~mage_rl.policy.models.load_model` when ``engine``
            is ``None`` (e.g. ``"tiny"``).
        dtype: Precision of that model.
        seed: Seed of the engine's sampling stream.
    """

    def __init__(
        self, engine: Any = None, *, model: str | None = None, dtype: str = "fp32", seed: int = 0
    ) -> None:
        if engine is None:
            if model is None:
                raise ValueError("LocalVLLMEngine needs an engine or a model spec")
            from mage_rl.policy.engine import LocalEngine
            from mage_rl.policy.models import load_model

            net, tokenizer = load_model(model, dtype=dtype)  # type: ignore[arg-type]
            engine = LocalEngine(net, tokenizer, seed=seed, name=model)
        self.engine = engine
        self.requests = 0
        self._unfinished = 0

    async def generate(
        self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None
    ) -> RequestOutput:
        """Sample one response to ``prompt_token_ids`` (see the module docstring)."""
        if multi_modal_data:
            raise ValueError("the local stand-in engine takes text only")
        top_k = int(getattr(sampling_params, "top_k", -1) or -1)
        stop = getattr(sampling_params, "stop", None) or ()
        params = SamplingParams(
            temperature=float(sampling_params.temperature),
            top_p=float(sampling_params.top_p),
            top_k=top_k if top_k > 0 else 0,
            max_tokens=int(sampling_params.max_tokens),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            seed=getattr(sampling_params, "seed", None),
        )
        self.requests += 1
        self._unfinished += 1
        try:
            generation = await self.engine.generate_from_ids(prompt_token_ids, params)
        finally:
            self._unfinished -= 1
        logprobs = None
        if getattr(sampling_params, "logprobs", None) is not None:
            logprobs = [
                {token: Logprob(lp, rank=None)}
                for token, lp in zip(generation.response_ids, generation.logprobs, strict=True)
            ]
        completion = CompletionOutput(
            index=0,
            text=generation.text,
            token_ids=list(generation.response_ids),
            cumulative_logprob=float(sum(generation.logprobs)),
            logprobs=logprobs,
            finish_reason=generation.finish_reason,
        )
        return RequestOutput(
            request_id=str(self.requests),
            prompt=None,
            prompt_token_ids=list(generation.prompt_ids),
            outputs=[completion],
        )

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or decoding."""
        return self._unfinished

    def update_weights(self, state_dict: dict[str, Any]) -> int:
        """Load new weights (the stand-in for OpenRLHF's broadcast); returns the version."""
        self.engine.update_weights(state_dict)
        return int(self.engine.weight_version)

    def close(self) -> None:
        """Stop the local engine."""
        self.engine.close()
