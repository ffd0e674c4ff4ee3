"""Decode one batch of requests together: left-padded prefill, then cached decode steps.

This is the compute half of :class:`~mage_rl.policy.engine.LocalEngine`; it runs on the
engine's worker thread and never touches an event loop.

1. Left-pad the prompts to a common length ``T``; the attention mask hides the padding
   and ``position_ids`` count only real tokens, so each row sees exactly what it would
   see alone. A constrained request's prompt is followed by the tokens all its choices
   share (``<action>`` of ``<action>PASS</action>`` and ``<action>BET</action>``): they
   have only one allowed value, log-prob 0, and need no decode step of their own.
2. Prefill: one forward pass over ``(B, T)`` fills the KV cache and gives the logits of
   the first response token (only the last position's logits are computed).
3. Each decode step samples one token per row (:mod:`mage_rl.policy.sampling`), checks
   EOS, stop strings and the length limit, and runs ONE forward pass over ``(B', 1)`` for
   the rows still going. A finished row leaves the batch (its KV cache rows are dropped)
   and its request is answered immediately rather than at the end of the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from mage_rl.policy.base import Generation, SamplingParams
from mage_rl.policy.constrained import allowed_next, is_complete, restricted_logprobs
from mage_rl.policy.sampling import draw, sampling_logprobs
from mage_rl.policy.tokenization import find_stop

logger = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    """One request inside the decode loop.

    Attributes:
        prompt_ids: Rendered prompt ids.
        params: Sampling parameters.
        generator: This request's random stream.
        max_new_tokens: ``params.max_tokens`` capped by the model's context length.
        resolve: Called once, from the worker thread, with the finished
            :class:`Generation` or the exception that ended the batch.
        cancelled: Returns True when nobody waits for the answer any more.
        on_token: Called from the worker thread with every sampled token, before the
            request is resolved: ``(token_id, logprob, top)``, where ``top`` holds the
            ``top_logprobs`` most likely ``(token_id, logprob)`` pairs of the distribution
            the token was drawn from (empty when ``top_logprobs`` is 0). For streaming.
        top_logprobs: How many alternatives ``on_token`` receives per token.
        response_ids: Sampled ids so far.
        logprobs: Their recorded log-probs.
        candidates: Constrained decoding: the token ids of every allowed response
            (:mod:`mage_rl.policy.constrained`); ``None`` samples freely.
        allowed: With ``candidates``, the allowed token ids of every sampled position.
    """

    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    max_new_tokens: int
    resolve: Callable[[Generation | BaseException], None]
    cancelled: Callable[[], bool] = lambda: False
    on_token: Callable[[int, float, list[tuple[int, float]]], None] | None = None
    top_logprobs: int = 0
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    candidates: list[list[int]] | None = None
    allowed: list[list[int]] = field(default_factory=list)
    _text_len: int = 0


@dataclass
class DecodeStats:
    """Counters over the engine's lifetime, for logs, benchmarks and tests.

    Attributes:
        batches: Batches run.
        requests: Requests answered.
        forward_passes: Model forward passes (one prefill plus one per decode step).
        prompt_tokens: Real (unpadded) tokens prefilled: the prompts, and the tokens
            every choice of a constrained request starts with.
        generated_tokens: Tokens sampled (a constrained request's shared leading tokens
            and the rest of its choice once only one is left are taken, not sampled).
        largest_batch: Most requests decoded together.
        compute_seconds: Wall time spent in batches.
    """

    batches: int = 0
    requests: int = 0
    forward_passes: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    largest_batch: int = 0
    compute_seconds: float = 0.0


def decode_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    requests: list[DecodeRequest],
    *,
    pad_id: int,
    eos_ids: set[int],
    stats: DecodeStats,
) -> None:
    """Generate a response for every request, answering each as soon as it ends.

    Args:
        model: A causal LM that accepts ``past_key_values``, ``attention_mask``,
            ``position_ids`` and ``logits_to_keep``.
        tokenizer: Decodes response ids into text.
        requests: The batch; every prompt is non-empty.
        pad_id: Id used for left padding (masked out, so its value does not matter).
        eos_ids: Ids that end a response; the EOS token is kept in ``response_ids``.
        stats: Counters updated in place.
    """
    start = time.perf_counter()
    device = next(model.parameters()).device
    active = list(requests)
    # Counted up front: callers may read the stats as soon as the last request resolves.
    stats.batches += 1
    stats.requests += len(requests)
    stats.largest_batch = max(stats.largest_batch, len(requests))
    try:
        # Tokens every allowed choice shares (``<action>`` of ``<action>PASS</action>`` and
        # ``<action>BET</action>``) are not drawn: they go into the prefill with the prompt.
        active = [r for r in active if not _force_prefix(r, tokenizer)]
        if not active:
            return
        with torch.inference_mode():
            input_ids, attention_mask = _left_pad(
                [r.prompt_ids + r.response_ids for r in active], pad_id, device
            )  # (B, T), (B, T)
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
            next_position = attention_mask.sum(-1)  # (B,)
            cache = DynamicCache(config=model.config)
            logits = model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1, :]  # (B, V)
            stats.forward_passes += 1
            stats.prompt_tokens += int(next_position.sum())

            temperature = torch.tensor([r.params.temperature for r in active], device=device)
            top_k = torch.tensor([r.params.top_k for r in active], device=device)
            top_p = torch.tensor([r.params.top_p for r in active], device=device)
            while True:
                logp = sampling_logprobs(logits, temperature, top_k, top_p)  # (B, V)
                _constrain(active, logits, logp)
                tokens, token_logp = draw(
                    logp, [r.params.temperature == 0 for r in active], [r.generator for r in active]
                )
                stats.generated_tokens += len(active)
                _report_tokens(active, tokens, token_logp, logp)
                keep = [
                    i
                    for i, (request, token, lp) in enumerate(
                        zip(active, tokens.tolist(), token_logp.tolist(), strict=True)
                    )
                    if not _advance(request, token, lp, tokenizer, eos_ids)
                ]
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, device=device)
                    cache.batch_select_indices(index)
                    active = [active[i] for i in keep]
                    tokens, attention_mask = tokens[index], attention_mask[index]
                    next_position = next_position[index]
                    temperature, top_k, top_p = temperature[index], top_k[index], top_p[index]
                ones = attention_mask.new_ones((len(active), 1))
                attention_mask = torch.cat([attention_mask, ones], dim=-1)  # (B', T + t)
                logits = model(
                    input_ids=tokens[:, None],
                    attention_mask=attention_mask,
                    position_ids=next_position[:, None],
                    past_key_values=cache,
                    use_cache=True,
                ).logits[:, -1, :]  # (B', V)
                next_position = next_position + 1
                stats.forward_passes += 1
    except BaseException as error:  # answer every waiting request, whatever went wrong
        logger.exception("decode batch of %d requests failed", len(requests))
        for request in active:
            request.resolve(error)
        if not isinstance(error, Exception):
            raise
    finally:
        elapsed = time.perf_counter() - start
        stats.compute_seconds += elapsed
        logger.debug("decoded a batch of %d requests in %.3fs", len(requests), elapsed)


def _report_tokens(
    active: list[DecodeRequest],
    tokens: torch.Tensor,
    token_logp: torch.Tensor,
    logp: torch.Tensor,
) -> None:
    """Hand each sampled token, with its top alternatives when asked, to ``on_token``."""
    rows = [i for i, r in enumerate(active) if r.on_token is not None and not r.cancelled()]
    if not rows:
        return
    k = max(active[i].top_logprobs for i in rows)
    top_ids: list[list[int]] = [[] for _ in rows]
    top_lp: list[list[float]] = [[] for _ in rows]
    if k > 0:
        values, indices = torch.topk(logp[rows], min(k, logp.shape[-1]), dim=-1)  # (R, k)
        top_ids, top_lp = indices.tolist(), values.tolist()
    for j, i in enumerate(rows):
        request = active[i]
        n = request.top_logprobs
        top = list(zip(top_ids[j][:n], top_lp[j][:n], strict=True))
        request.on_token(int(tokens[i]), float(token_logp[i]), top)  # type: ignore[misc]


def _constrain(active: list[DecodeRequest], logits: torch.Tensor, logp: torch.Tensor) -> None:
    """Replace the rows of constrained requests by their restricted distribution, in place."""
    for i, request in enumerate(active):
        if request.candidates is None:
            continue
        allowed = allowed_next(request.candidates, request.response_ids)
        logp[i] = restricted_logprobs(logits[i], request.params.temperature, allowed)
        request.allowed.append(allowed)


def _force_prefix(request: DecodeRequest, tokenizer: PreTrainedTokenizerBase) -> bool:
    """Append the tokens a constrained request must start with; True if that ends it.

    While only one token is allowed next, it is taken without a forward pass, with
    log-prob exactly 0 (the restricted distribution has one outcome), and reported to
    ``on_token`` like a drawn token. A single allowed choice is answered whole here.
    """
    if request.candidates is None or request.cancelled():
        return request.cancelled()
    for token in _take_forced(request):
        if request.on_token is not None:
            request.on_token(token, 0.0, [(token, 0.0)][: request.top_logprobs])
    if not is_complete(request.candidates, request.response_ids):
        return False
    _answer(request, "stop", _decode(tokenizer, request.response_ids))
    return True


def _complete_forced(request: DecodeRequest) -> None:
    """Once one choice is left, append its remaining tokens without forward passes.

    Only then: a token appended in the middle of decoding would be missing from the KV
    cache, while a finished request needs no further forward pass.
    """
    assert request.candidates is not None
    prefix = request.response_ids
    if sum(list(c[: len(prefix)]) == prefix for c in request.candidates) == 1:
        _take_forced(request)


def _take_forced(request: DecodeRequest) -> list[int]:
    """Append tokens while only one is allowed next; return them.

    Each such token is the only allowed one, so its restricted log-prob is exactly 0.
    """
    assert request.candidates is not None
    taken = []
    while len(allowed := allowed_next(request.candidates, request.response_ids)) == 1:
        request.response_ids.append(allowed[0])
        request.logprobs.append(0.0)
        request.allowed.append([allowed[0]])
        taken.append(allowed[0])
    return taken


def _advance(
    request: DecodeRequest,
    token: int,
    logprob: float,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: set[int],
) -> bool:
    """Append one sampled token; answer the request and return True if it is finished."""
    if request.cancelled():
        return True
    request.response_ids.append(token)
    request.logprobs.append(logprob)
    finish_reason: str | None = None
    text: str | None = None
    if token in eos_ids:
        finish_reason = "stop"
    elif request.params.stop and request.candidates is None:
        text = _decode(tokenizer, request.response_ids)
        # A few characters of slack: a multi-byte character split across tokens decodes to
        # a replacement character that the next token may turn into a shorter string.
        if find_stop(text, request.params.stop, max(0, request._text_len - 4)):
            finish_reason = "stop"
        request._text_len = len(text)
    if request.candidates is not None:
        _complete_forced(request)
        if is_complete(request.candidates, request.response_ids):
            finish_reason = "stop"
    if finish_reason is None and len(request.response_ids) >= request.max_new_tokens:
        finish_reason = "length"
    if finish_reason is None:
        return False
    _answer(
        request, finish_reason, _decode(tokenizer, request.response_ids) if text is None else text
    )
    return True


def _answer(request: DecodeRequest, finish_reason: str, text: str) -> None:
    request.resolve(
        Generation(
            text=text,
            prompt_ids=list(request.prompt_ids),
            response_ids=list(request.response_ids),
            logprobs=list(request.logprobs),
            finish_reason=finish_reason,
            allowed=[list(ids) for ids in request.allowed],
        )
    )


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """The response text: special tokens (EOS) skipped, as the invariant requires."""
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def _left_pad(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts into ``(B, T)`` ids and a ``(B, T)`` attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)
