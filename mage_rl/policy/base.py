"""The policy interface every backend implements.

A *policy* turns a chat (a list of ``{"role": ..., "content": ...}`` messages) into one
sampled response. Training needs more than the text: the prompt and response token ids
and the log-probability of every sampled token under the distribution it was actually
drawn from. Backends that cannot provide ids or log-probs (a plain remote endpoint)
return empty lists, and the trainer refuses such turns with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(frozen=True)
class SamplingParams:
    """How one response is sampled.

    Attributes:
        temperature: Softmax temperature; 0 means greedy decoding.
        top_p: Nucleus truncation (1.0 keeps the whole distribution).
        top_k: Keep only the k most likely tokens (0 keeps all).
        max_tokens: Upper bound on generated tokens; reaching it gives
            ``finish_reason == "length"``.
        stop: Strings that end generation; the stop string is kept in the text so that a
            closing tag such as ``</action>`` stays parsable.
        seed: Seed for this request's sampler; ``None`` draws from the engine's stream.
        choices: Constrained decoding: when non-empty, the response is exactly one of
            these strings, sampled token by token from the softmax restricted to the
            tokens that stay on a choice (:mod:`mage_rl.policy.constrained`); ``top_p``,
            ``top_k`` and ``stop`` do not apply. Supported by the local engine.
        explore: With ``choices``: at each position where several tokens are allowed,
            the token is drawn from ``(1 - explore) * p + explore * uniform`` over the
            allowed tokens, and that mixture's log-prob is what the generation records
            (the behaviour policy, for an exact PPO ratio). 0 samples ``p`` itself.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    choices: tuple[str, ...] = ()
    explore: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.explore < 1:
            raise ValueError(f"explore must be in [0, 1), got {self.explore}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not isinstance(self.choices, tuple):
            object.__setattr__(self, "choices", tuple(self.choices))
        if any(not isinstance(c, str) or not c for c in self.choices):
            raise ValueError(f"choices must be non-empty strings, got {list(self.choices)}")


class RequestRejected(ValueError):
    """A request a policy cannot serve as given: a prompt longer than the model's context,
    constrained-decoding choices that cannot be decoded. The caller's input is at fault,
    not the policy, so a server answers it with a 400."""


@dataclass
class Generation:
    """One sampled response with everything the learner needs.

    Attributes:
        text: The decoded response.
        prompt_ids: Token ids of the rendered prompt (chat template applied).
        response_ids: Token ids of the response, in order.
        logprobs: ``logprobs[i]`` is the log-probability of ``response_ids[i]`` under the
            distribution it was sampled from (after temperature and truncation).
        finish_reason: ``"stop"`` (end of sequence or stop string) or ``"length"``.
        allowed: With constrained decoding, the allowed token ids of every response
            position (the support ``logprobs`` were normalised over); empty otherwise.
    """

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"
    allowed: list[list[int]] = field(default_factory=list)

    @property
    def has_tokens(self) -> bool:
        """Whether this generation carries what training needs."""
        return bool(self.response_ids) and len(self.logprobs) == len(self.response_ids)


@runtime_checkable
class Policy(Protocol):
    """Anything that samples a response to a chat."""

    name: str

    async def generate(self, messages: list[Message], params: SamplingParams) -> Generation:
        """Sample one response to ``messages``."""
        ...
