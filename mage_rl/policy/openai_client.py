"""A :class:`~mage_rl.policy.base.Policy` over an OpenAI-compatible chat endpoint.

Meant for ``vllm serve`` on a GPU (rollouts at scale) and for evaluating any hosted model.
Each ``generate`` is one ``POST /chat/completions`` that asks for:

* ``logprobs=True``: the log-prob of every sampled token (``choices[0].logprobs.content``).
* ``return_token_ids=True`` (vLLM >= 0.10.2, sent in ``extra_body``): vLLM then adds
  ``prompt_token_ids`` to the response and ``token_ids`` to each choice. Both names are
  read from the response and from the choice; ``response_token_ids`` is accepted for
  ``token_ids``, as some patched servers use it.
* ``include_stop_str_in_output=True`` (vLLM): keep the stop string in the text, as the
  local engine does; and ``top_k`` when it is set.

These extensions are vLLM's; pass ``vllm_extensions=False`` for servers that reject
unknown fields (OpenAI itself). Then ids are empty, ``top_k`` is not sent, and the server
decides whether a stop string stays in the text.

Log-prob semantics: vLLM reports *raw* log-probs (before temperature and truncation) by
default. Start it with ``--logprobs-mode processed_logprobs`` so that the recorded
log-probs follow the convention of :mod:`mage_rl.policy.sampling`.

Transient failures (connection errors, timeouts, HTTP 429 and 5xx) are retried with
exponential backoff by tenacity; other HTTP errors (4xx) are raised at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from typing import Any

import openai
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from mage_rl.policy.base import Generation, Message, SamplingParams

logger = logging.getLogger(__name__)


class EndpointError(RuntimeError):
    """The endpoint answered with an error, or not at all."""


class EndpointUnreachableError(EndpointError, ConnectionError):
    """The endpoint could not be reached (after retries)."""


def is_transient(error: BaseException) -> bool:
    """Whether a failed call is worth retrying: connection errors, timeouts, 429, 5xx."""
    if isinstance(error, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(error, openai.APIStatusError):
        return error.status_code == 429 or error.status_code >= 500
    return False


class OpenAIPolicy:
    """Sample responses from an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: Endpoint root, e.g. ``http://localhost:8000/v1``.
        model: Model name the server knows.
        api_key: API key; default ``$OPENAI_API_KEY``, else ``"EMPTY"`` (vLLM ignores it).
        timeout: Seconds before one HTTP attempt times out.
        max_retries: Retries of a transient failure (so ``max_retries + 1`` attempts).
        backoff_initial: First backoff in seconds; it doubles up to ``backoff_max``, with
            jitter so that many rollout workers do not retry in lockstep.
        backoff_max: Longest backoff in seconds.
        vllm_extensions: Send vLLM's extra fields (token ids, stop string in output,
            ``top_k``); turn off for servers that reject unknown fields.
        extra_body: More fields merged into every request body.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60,
        max_retries: int = 5,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 8.0,
        vllm_extensions: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.vllm_extensions = vllm_extensions
        self.extra_body = dict(extra_body or {})
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        # The SDK's HTTP pool belongs to the event loop it was first used in, so there is
        # one client per loop (generate_sync and LangChain's sync path make fresh loops).
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI]
        self._clients = weakref.WeakKeyDictionary()

    async def generate(
        self, messages: list[Message], params: SamplingParams | None = None
    ) -> Generation:
        """Sample one response.

        Args:
            messages: ``{"role", "content"}`` dicts.
            params: Sampling parameters (defaults: ``SamplingParams()``).

        Returns:
            The response; ids and log-probs are empty lists when the server gives none.

        Raises:
            EndpointUnreachableError: If the endpoint cannot be reached after retries.
            EndpointError: If it answers with an error (4xx at once, 429/5xx after
                retries) or with no choice.
        """
        params = params or SamplingParams()
        if params.choices:
            raise NotImplementedError(
                "constrained decoding (choices) needs the restricted log-probs of every token, "
                "which an OpenAI endpoint does not return; use the local engine "
                "(policy.model: tiny | smollm2 | PATH) or turn policy.constrain_actions off"
            )
        request = self._request(messages, params)
        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            # Works on tenacity 8.2 too, which has no ``multiplier`` in wait_exponential_jitter.
            wait=wait_exponential(multiplier=self.backoff_initial, max=self.backoff_max)
            + wait_random(0, self.backoff_initial),
            stop=stop_after_attempt(self.max_retries + 1),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._client().chat.completions.create(**request)
        except openai.APIConnectionError as error:
            raise EndpointUnreachableError(
                f"cannot reach the OpenAI-compatible endpoint at {self.base_url} "
                f"after {self.max_retries + 1} attempts ({type(error).__name__}: {error}); "
                "check that the server is running and the URL (including /v1) is right"
            ) from error
        except openai.APIStatusError as error:
            raise EndpointError(
                f"endpoint {self.base_url} answered HTTP {error.status_code} for model "
                f"{self.model!r}: {error.message}"
            ) from error
        return parse_chat_completion(response.model_dump(), self.base_url)

    async def aclose(self) -> None:
        """Close the HTTP client of the running event loop, if any."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def _client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                timeout=self.timeout,
                max_retries=0,  # tenacity retries, with our policy and our error messages
            )
            self._clients[loop] = client
        return client

    def _request(self, messages: list[Message], params: SamplingParams) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "logprobs": True,
            "n": 1,
        }
        if params.stop:
            request["stop"] = list(params.stop)
        if params.seed is not None:
            request["seed"] = params.seed
        extra: dict[str, Any] = {}
        if self.vllm_extensions:
            extra["return_token_ids"] = True
            extra["include_stop_str_in_output"] = True
            if params.top_k:
                extra["top_k"] = params.top_k
        elif params.top_k:
            logger.warning("top_k=%d is not sent: vllm_extensions is off", params.top_k)
        extra.update(self.extra_body)
        if extra:
            request["extra_body"] = extra
        return request

    def _log_retry(self, state: Any) -> None:
        error = state.outcome.exception() if state.outcome else None
        logger.warning(
            "%s: attempt %d failed (%s); retrying in %.2fs",
            self.base_url,
            state.attempt_number,
            error,
            state.next_action.sleep if state.next_action else 0.0,
        )


def parse_chat_completion(data: dict[str, Any], source: str = "endpoint") -> Generation:
    """Build a :class:`Generation` from a chat-completion response body.

    Args:
        data: The response as a dict (``ChatCompletion.model_dump()`` or raw JSON).
        source: Named in error messages.

    Returns:
        The generation; ``prompt_ids``, ``response_ids`` and ``logprobs`` are empty lists
        when the response lacks them.

    Raises:
        EndpointError: If the response has no choice.
    """
    choices = data.get("choices") or []
    if not choices:
        raise EndpointError(f"{source} returned no choices: {str(data)[:200]}")
    choice = choices[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    prompt_ids = _ids(choice.get("prompt_token_ids")) or _ids(data.get("prompt_token_ids"))
    response_ids = (
        _ids(choice.get("token_ids"))
        or _ids(choice.get("response_token_ids"))
        or _ids(data.get("token_ids"))
        or _ids(data.get("response_token_ids"))
    )
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(item["logprob"]) for item in content if item.get("logprob") is not None]
    if response_ids and logprobs and len(response_ids) != len(logprobs):
        logger.warning(
            "%s returned %d token ids but %d log-probs; the turn cannot be trained on",
            source,
            len(response_ids),
            len(logprobs),
        )
    finish_reason = "length" if choice.get("finish_reason") == "length" else "stop"
    return Generation(
        text=text,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        logprobs=logprobs,
        finish_reason=finish_reason,
    )


def _ids(value: object) -> list[int]:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    return []
