"""Request bodies of the OpenAI API subset the server speaks, and its error shape.

Validation follows OpenAI's published ranges (temperature in [0, 2], top_p in (0, 1],
n >= 1, at most 4 stop strings, top_logprobs in [0, 20], legacy completions logprobs in
[0, 5]), with two limits of its own: a temperature is 0 (greedy) or at least
``MIN_TEMPERATURE`` (smaller ones overflow float32 logits, as in vLLM), and integers
(``seed``, ``top_k``, ``max_tokens``) fit in int64. Types are strict, as in OpenAI's API:
``true`` or ``"1"`` is not a number and ``1`` is not a boolean. Fields the server cannot honour (tools, penalties, ``echo``) are rejected with
a 400 that names them rather than silently ignored; fields it does not know are ignored,
as OpenAI-compatible servers do, so newer clients keep working.

Extensions, as in vLLM: ``top_k``, ``return_token_ids`` (prompt and response token ids in
the response, for training on rollouts), ``include_stop_str_in_output`` and
``ignore_eos``. A served agent's requests add ``env``, ``session`` and ``seq``
(:mod:`mage_rl.serve.agent`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MIN_TEMPERATURE = 0.01
"""Smallest non-zero temperature: logits divided by less can overflow float32."""

Int = Annotated[int, Field(strict=True)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Bool = Annotated[bool, Field(strict=True)]

MAX_N = 16
MAX_MESSAGES = 4096
"""Messages per chat: validating each costs the event loop time, so a body of 100k tiny
messages would stall every other request."""
MAX_PROMPTS = 256
"""Prompts in one batched text completion."""
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
MAX_LEGACY_LOGPROBS = 5

ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error returned to the client as ``{"error": {...}}`` with an HTTP status.

    Args:
        status: HTTP status code.
        message: What went wrong and how to fix it.
        type: OpenAI error type (``invalid_request_error``, ``authentication_error``, ...).
        param: The request field at fault, if any.
        code: A short machine-readable code, if any.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI clients parse."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class _Request(BaseModel):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: Float | None = Field(default=None, ge=0, le=2)
    top_p: Float | None = Field(default=None, gt=0, le=1)
    top_k: Int | None = Field(default=None, ge=-1, le=INT64_MAX)
    n: Int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: Int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stream: Bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    logit_bias: dict[str, Any] | None = None
    return_token_ids: Bool = False
    include_stop_str_in_output: Bool = False
    ignore_eos: Bool = False

    @field_validator("temperature")
    @classmethod
    def _check_temperature(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {value} is too small to sample from in float32; use 0 for "
                f"greedy decoding or a value of at least {MIN_TEMPERATURE}"
            )
        return value

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list):
            if len(value) > MAX_STOP:
                raise ValueError(f"at most {MAX_STOP} stop strings, got {len(value)}")
            if any(not s for s in value):
                raise ValueError("stop strings must be non-empty")
        elif value == "":
            raise ValueError("stop strings must be non-empty")
        return value

    @model_validator(mode="after")
    def _check_unsupported(self) -> _Request:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value not in (None, 0, 0.0):
                raise ValueError(f"{name} is not supported by this server; leave it at 0")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server; leave it out")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage_in_stream(self) -> bool:
        """Whether a streamed response ends with a usage chunk (``stream_options``)."""
        return bool((self.stream_options or {}).get("include_usage"))


class ChatMessage(BaseModel):
    """One chat message; ``content`` may be a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _check_parts(cls, value: str | list[dict[str, Any]] | None) -> Any:
        if not isinstance(value, list):
            return value
        for i, part in enumerate(value):
            kind = part.get("type")
            if kind != "text":
                raise ValueError(
                    f"part {i} has type {kind!r}, which this server does not take; send "
                    "text parts ({'type': 'text', 'text': '...'}) only"
                )
            text = part.get("text")
            if not isinstance(text, str):
                got = "null" if text is None else type(text).__name__
                raise ValueError(
                    f"part {i} is a text part whose 'text' is {got}; it must be a string"
                )
        return value

    def text(self) -> str:
        """The content as one string (text parts joined; other parts are refused above)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part["text"] for part in self.content)


class ChatCompletionRequest(_Request):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = Field(default=None, ge=1, le=INT64_MAX)
    max_completion_tokens: Int | None = Field(default=None, ge=1, le=INT64_MAX)
    logprobs: Bool = False
    top_logprobs: Int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    user: str | None = Field(default=None, max_length=256)
    env: dict[str, Any] | None = None
    session: str | None = Field(default=None, max_length=64)
    seq: Int | None = Field(default=None, ge=0, le=INT64_MAX)

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.tools:
            raise ValueError("tools are not supported by this server; leave them out")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError("response_format other than 'text' is not supported")
        return self

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (the newer name) or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def chat(self) -> list[dict[str, str]]:
        """The messages as ``{"role", "content"}`` dicts for the chat template.

        ``developer`` (OpenAI's newer name for the system role) becomes ``system``.
        """
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in self.messages
        ]


class CompletionRequest(_Request):
    """Body of ``POST /v1/completions`` (the legacy text-completion API)."""

    prompt: str | list[str] | list[Int] | list[list[Int]]
    max_tokens: Int | None = Field(default=16, ge=1, le=INT64_MAX)
    logprobs: Int | None = Field(default=None, ge=0, le=MAX_LEGACY_LOGPROBS)
    echo: Bool = False
    suffix: str | None = None
    best_of: Int | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported by this server; leave it false")
        if self.suffix:
            raise ValueError("suffix is not supported by this server; leave it out")
        if self.best_of not in (None, 1, self.n):
            raise ValueError("best_of is not supported by this server; leave it out")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt as text or token ids (a batch gives several)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]
