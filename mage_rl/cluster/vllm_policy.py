"""A MAGE policy over vLLM engines with OpenRLHF's token-level ``generate`` contract.

OpenRLHF 0.11 wraps every vLLM engine in a Ray actor (``RolloutRayActor``) whose
``generate(prompt_token_ids, sampling_params)`` returns a vLLM ``RequestOutput``. Its own
agent loop sends one growing token sequence through it and trains on one sample per
trajectory. MAGE instead runs its meta-episode graphs on the driver and sends every LLM
call (a play or reflect turn) to an engine as one request; each call becomes one
training sample, exactly as with the local engine.

:class:`VLLMEnginePolicy` is that bridge:

1. Render the chat with the tokenizer's chat template (the same ids the learner trains on).
2. Send ``(prompt ids, vLLM SamplingParams)`` to the engine with the fewest requests in
   flight, with ``logprobs=1`` so the sampled token's log-prob comes back; the engines are
   created with ``logprobs_mode="processed_logprobs"``, so that log-prob is taken after
   temperature, as MAGE's :class:`~mage_rl.policy.base.Generation` requires.
3. Turn the first completion into a :class:`~mage_rl.policy.base.Generation`.

Engines may be Ray actor handles (``engine.generate.remote(...)`` is awaited) or plain
objects with an ``async generate`` (the stand-in of :mod:`mage_rl.cluster.standin`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mage_rl.cluster.deps import require
from mage_rl.policy.base import Generation, Message, SamplingParams
from mage_rl.policy.tokenization import render_prompt


def vllm_sampling_params(**kwargs: Any) -> Any:
    """``vllm.SamplingParams(**kwargs)``, imported only when called."""
    return require("vllm", "train.backend=openrlhf").SamplingParams(**kwargs)


def to_vllm_kwargs(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """MAGE sampling parameters as ``vllm.SamplingParams`` keyword arguments.

    Raises:
        ValueError: For constrained decoding (``params.choices``), which the cluster
            learner cannot score (see docs/cluster.md).
    """
    if getattr(params, "choices", ()):
        raise ValueError(
            "constrained decoding (policy.constrain_actions) is not available with vLLM "
            "engines: OpenRLHF's actor would score the unrestricted distribution; set "
            "policy.constrain_actions: false for train.backend=openrlhf"
        )
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM: -1 disables top-k
        "max_tokens": max_tokens,
        "stop": list(params.stop) or None,
        "include_stop_str_in_output": True,  # keep the closing tag parsable
        "skip_special_tokens": True,
        "seed": params.seed,
        "logprobs": 1,  # the sampled token's log-prob is always among those returned
    }


def generation_from_output(output: Any, prompt_ids: Sequence[int]) -> Generation:
    """A vLLM ``RequestOutput`` (first completion) as a MAGE :class:`Generation`.

    Raises:
        ValueError: If the completion carries no log-probs (the request lacked
            ``logprobs=1``) or lacks the sampled token among them.
    """
    completion = output.outputs[0]
    token_ids = [int(t) for t in completion.token_ids]
    if completion.logprobs is None:
        raise ValueError("the engine returned no log-probs; request them with logprobs=1")
    logprobs = []
    for position, (token, candidates) in enumerate(
        zip(token_ids, completion.logprobs, strict=True)
    ):
        if token not in candidates:
            raise ValueError(f"response token {position} ({token}) has no log-prob in the output")
        logprobs.append(float(candidates[token].logprob))
    return Generation(
        text=completion.text,
        prompt_ids=[int(i) for i in prompt_ids],
        response_ids=token_ids,
        logprobs=logprobs,
        finish_reason="length" if completion.finish_reason == "length" else "stop",
    )


class VLLMEnginePolicy:
    """:class:`~mage_rl.policy.base.Policy` that samples on vLLM engines.

    Args:
        engines: OpenRLHF ``RolloutRayActor`` handles, or objects with the same
            ``async generate(prompt_token_ids, sampling_params)``.
        tokenizer: The HF tokenizer of the model (its chat template renders prompts).
        max_model_len: The engines' context length; responses are cut to fit in it.
        sampling_params_factory: Builds the engine's sampling-parameter object from
            keyword arguments; default ``vllm.SamplingParams``.
        name: Policy name for logs and chat-model metadata.
    """

    def __init__(
        self,
        engines: Sequence[Any],
        tokenizer: Any,
        *,
        max_model_len: int,
        sampling_params_factory: Callable[..., Any] = vllm_sampling_params,
        name: str = "vllm",
    ) -> None:
        if not engines:
            raise ValueError("VLLMEnginePolicy needs at least one engine")
        self.engines = list(engines)
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.make_params = sampling_params_factory
        self.name = name
        self.in_flight = [0] * len(self.engines)
        self.calls = [0] * len(self.engines)

    async def generate(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Sample one response to a chat on the least busy engine.

        Raises:
            ValueError: If the prompt leaves no room in ``max_model_len``, or for
                constrained decoding.
        """
        params = params or SamplingParams()
        prompt_ids = render_prompt(self.tokenizer, messages)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room in max_len "
                f"{self.max_model_len}; raise openrlhf.max_len or shorten the chat"
            )
        vllm_params = self.make_params(**to_vllm_kwargs(params, min(params.max_tokens, room)))
        index = min(range(len(self.engines)), key=lambda i: (self.in_flight[i], self.calls[i]))
        engine = self.engines[index]
        self.in_flight[index] += 1
        self.calls[index] += 1
        try:
            method = engine.generate
            if hasattr(method, "remote"):  # a Ray actor handle: the ObjectRef is awaitable
                output = await method.remote(list(prompt_ids), vllm_params)
            else:
                output = await method(list(prompt_ids), vllm_params)
        finally:
            self.in_flight[index] -= 1
        return generation_from_output(output, prompt_ids)
