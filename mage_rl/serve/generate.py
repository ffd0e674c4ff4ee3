"""Run the choices of one request on the engine, whole or streamed, and shape the text.

A request with ``n`` choices becomes ``n`` engine requests that share the prompt; the
engine batches them with everything else in flight. Each choice collects its tokens
through the engine's per-token callback (:meth:`LocalEngine.generate_from_ids`), which
also carries the ``top_logprobs`` alternatives, so whole and streamed responses are built
from the same data.

Text and stop strings: the engine keeps the stop string in the text (the project's
convention, so that ``decode(response_ids) == text`` and a turn can be trained on). OpenAI
leaves it out, so the server cuts the text at the first stop string unless the request
sets ``include_stop_str_in_output`` (vLLM's flag, which
:class:`~mage_rl.policy.openai_client.OpenAIPolicy` sends). The token ids and log-probs
always cover every sampled token, the EOS token included.

Log-probs are those of the distribution each token was sampled from (after temperature,
top-k and top-p; see :mod:`mage_rl.policy.sampling`), like vLLM's
``--logprobs-mode processed_logprobs``. Tokens that truncation removed have log-prob
``-inf``, sent as ``-9999.0`` as OpenAI does. A chat entry's ``bytes`` are the token's own
bytes (:func:`~mage_rl.policy.tokenization.token_bytes`), also for a token that holds
part of a multi-byte character and so decodes to U+FFFD on its own. Legacy completion
log-probs cover the tokens of the text the client receives: special tokens (the EOS) and
tokens past a cut stop string are left out, and ``text_offset`` is the character offset
of each token in that text.
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from mage_rl.policy.base import Generation, SamplingParams
from mage_rl.policy.engine import LocalEngine
from mage_rl.policy.tokenization import special_token_ids, token_bytes

MIN_LOGPROB = -9999.0

TopList = list[tuple[int, float]]


@dataclass
class Choice:
    """One finished choice.

    Attributes:
        index: Position in the response's ``choices``.
        generation: What the engine returned (full text, ids, log-probs).
        text: The text sent to the client (stop string cut unless asked to keep it).
        top: Per response token, its ``top_logprobs`` alternatives.
    """

    index: int
    generation: Generation
    text: str
    top: list[TopList] = field(default_factory=list)


@dataclass
class TokenEvent:
    """One sampled token of a streamed choice, with the text it made safe to send."""

    index: int
    token: int
    logprob: float
    top: TopList
    delta: str


@dataclass
class DoneEvent:
    """A streamed choice finished; ``delta`` is text held back until now."""

    choice: Choice
    delta: str


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops if s) if i != -1]
    return (text[: min(cuts)], True) if cuts else (text, False)


def client_text(text: str, stops: tuple[str, ...], include_stop: bool) -> str:
    """The text a client receives for an engine response (see the module docstring)."""
    return text if include_stop else cut_at_stop(text, stops)[0]


class TextStream:
    """Incremental detokenization of one streamed choice.

    Each token re-decodes the response so far and releases only text that cannot change:
    a trailing replacement character (half of a multi-byte character) and, when stop
    strings are cut, a tail that could be the start of a stop string are held back until
    the next token or the end.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, stops: tuple[str, ...], include_stop: bool
    ) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.include_stop = include_stop
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> str:
        """Add a token; return the newly releasable text."""
        self.ids.append(token)
        text = str(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        stopped = False
        if not self.include_stop:
            text, stopped = cut_at_stop(text, self.stops)
        hold = 0
        if not stopped:
            hold = len(text) - len(text.rstrip("\ufffd"))
            if not self.include_stop:
                hold = max(hold, _partial_stop(text, self.stops))
        return self._release(text[: len(text) - hold])

    def finish(self, final_text: str) -> str:
        """Release whatever of ``final_text`` was not sent yet."""
        return self._release(final_text)

    def _release(self, text: str) -> str:
        delta = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return delta


def _partial_stop(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:length]):
                best = length
                break
    return best


async def run_choices(
    engine: LocalEngine,
    prompt_ids: list[int],
    params: list[SamplingParams],
    *,
    top_logprobs: int = 0,
    include_stop: bool = False,
    first_index: int = 0,
    ignore_eos: bool = False,
) -> list[Choice]:
    """Sample one choice per entry of ``params`` for one prompt, concurrently.

    Cancelling the call cancels every choice in the engine.
    """

    async def one(i: int, p: SamplingParams) -> Choice:
        top: list[TopList] = []

        def collect(_token: int, _logprob: float, alternatives: TopList) -> None:
            top.append(alternatives)

        generation = await engine.generate_from_ids(
            prompt_ids, p, on_token=collect if top_logprobs else None, top_logprobs=top_logprobs,
            ignore_eos=ignore_eos,
        )  # fmt: skip
        text = client_text(generation.text, p.stop, include_stop)
        return Choice(first_index + i, generation, text, top)

    tasks = [asyncio.ensure_future(one(i, p)) for i, p in enumerate(params)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:  # one choice failed or the caller cancelled: the others stop decoding too
        for task in tasks:
            task.cancel()


async def stream_choices(
    engine: LocalEngine,
    prompt_ids: list[int],
    params: list[SamplingParams],
    *,
    top_logprobs: int = 0,
    include_stop: bool = False,
    ignore_eos: bool = False,
) -> AsyncIterator[TokenEvent | DoneEvent]:
    """Yield every choice's tokens as the engine draws them, then one :class:`DoneEvent`
    per choice. Leaving the iteration early (client gone) cancels the unfinished choices,
    which then leave the engine's batch at the next step."""
    events: asyncio.Queue[TokenEvent | tuple[int, asyncio.Task[Generation]]] = asyncio.Queue()
    streams = [TextStream(engine.tokenizer, p.stop, include_stop) for p in params]
    tops: list[list[TopList]] = [[] for _ in params]

    def on_token(i: int) -> Callable[[int, float, TopList], None]:
        def push(token: int, logprob: float, top: TopList) -> None:
            tops[i].append(top)
            events.put_nowait(TokenEvent(i, token, logprob, top, streams[i].push(token)))

        return push

    def finished(i: int) -> Callable[[asyncio.Task[Generation]], None]:
        return lambda task: events.put_nowait((i, task))

    tasks = []
    for i, p in enumerate(params):
        task = asyncio.ensure_future(
            engine.generate_from_ids(
                prompt_ids,
                p,
                on_token=on_token(i),
                top_logprobs=top_logprobs,
                ignore_eos=ignore_eos,
            )  # fmt: skip
        )
        # Token callbacks are queued on the loop before the answer, so "done" comes last.
        task.add_done_callback(finished(i))
        tasks.append(task)
    try:
        remaining = len(tasks)
        while remaining:
            event = await events.get()
            if isinstance(event, TokenEvent):
                yield event
                continue
            i, task = event
            remaining -= 1
            generation = task.result()  # re-raises an engine failure
            text = client_text(generation.text, params[i].stop, include_stop)
            yield DoneEvent(Choice(i, generation, text, tops[i]), streams[i].finish(text))
    finally:
        for task in tasks:
            task.cancel()


def token_entry(
    tokenizer: PreTrainedTokenizerBase, token: int, logprob: float
) -> dict[str, object]:
    """One ``{"token", "logprob", "bytes"}`` entry of chat log-probs."""
    text = str(tokenizer.decode([token]))
    return {
        "token": text,
        "logprob": max(logprob, MIN_LOGPROB),
        "bytes": list(token_bytes(tokenizer, token)),
    }


def chat_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    tokens: list[int],
    logprobs: list[float],
    tops: list[TopList],
) -> dict[str, object]:
    """The ``logprobs`` object of a chat choice (or chunk) for these tokens."""
    content = []
    for j, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
        entry = token_entry(tokenizer, token, logprob)
        alternatives = tops[j] if j < len(tops) else []
        entry["top_logprobs"] = [token_entry(tokenizer, t, lp) for t, lp in alternatives]
        content.append(entry)
    return {"content": content}


class LegacyOffsets:
    """Character offsets of a choice's tokens in its text, for legacy log-probs.

    Feeds each token's bytes to an incremental UTF-8 decoder: a token's offset is the
    number of characters complete before it, so tokens that split a character do not
    shift the offsets of those after them. Special tokens are skipped (no text).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, text_len: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.special = special_token_ids(tokenizer)
        self.text_len = text_len
        self.chars = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def entries(
        self, tokens: list[int], logprobs: list[float], tops: list[TopList]
    ) -> dict[str, list]:
        """Legacy ``logprobs`` lists for the next ``tokens`` of the choice."""
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": []}  # fmt: skip
        for j, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
            if token in self.special:
                continue
            offset = self.chars
            if self.text_len is not None and offset >= self.text_len:
                break  # past a stop string the client's text was cut at
            self.chars += len(self._utf8.decode(token_bytes(self.tokenizer, token)))
            out["tokens"].append(str(self.tokenizer.decode([token])))
            out["token_logprobs"].append(max(logprob, MIN_LOGPROB))
            out["top_logprobs"].append(
                {
                    str(self.tokenizer.decode([t])): max(lp, MIN_LOGPROB)
                    for t, lp in (tops[j] if j < len(tops) else [])
                }
            )
            out["text_offset"].append(
                offset if self.text_len is None else min(offset, self.text_len)
            )
        return out


def completion_logprobs(
    tokenizer: PreTrainedTokenizerBase,
    tokens: list[int],
    logprobs: list[float],
    tops: list[TopList],
    text: str,
) -> dict[str, object]:
    """The legacy ``logprobs`` object of a whole text-completion choice whose client
    text is ``text`` (see the module docstring)."""
    return dict(LegacyOffsets(tokenizer, len(text)).entries(tokens, logprobs, tops))
