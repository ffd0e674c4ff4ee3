"""Constrained decoding: sample one of a fixed set of strings, token by token.

Small models rarely produce a well-formed answer such as ``<action>BET</action>`` on their
own. With ``SamplingParams(choices=(...))`` the engine samples only continuations that
stay on one of the given strings:

1. Every choice is tokenized once (its canonical tokenization, no special tokens); the
   choices form a trie of token sequences.
2. At response position ``j``, the *allowed set* is the set of next tokens of the choices
   whose first ``j`` tokens equal the response so far.
3. The token is drawn from the softmax of the tempered logits restricted to the allowed
   set (``log p(t) = z_t / T - logsumexp(z_a / T for a in allowed)``). Top-k and top-p do
   not apply. At ``T == 0`` the argmax of the allowed set is taken and its log-prob is
   recorded under the untempered restricted distribution (the greedy convention of
   :mod:`mage_rl.policy.sampling`).
4. The response ends as soon as it equals a whole choice.

The engine records the allowed set of every response position next to the log-probs
(``Generation.allowed``). The learner scores a response with exactly the same restricted
softmax (:func:`mage_rl.rl.loss.gather_logprobs` with an ``allowed_index``), so the PPO
ratio is 1 when the weights have not changed. A position with one allowed token has
log-prob 0 and carries no gradient: only the tokens where choices diverge are learned.
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase


def choice_token_ids(tokenizer: PreTrainedTokenizerBase, choices: Sequence[str]) -> list[list[int]]:
    """Tokenize the choices and check that they can be decoded one token at a time.

    Args:
        tokenizer: The engine's tokenizer.
        choices: Distinct non-empty strings.

    Returns:
        One token-id list per choice.

    Raises:
        ValueError: On duplicates, a choice that does not decode back to itself, or a
            choice whose tokens are a prefix of another's (the response could not tell
            where to stop).
    """
    if len(set(choices)) != len(choices):
        raise ValueError(f"choices must be distinct, got {list(choices)}")
    # One batch call each way: the fast tokenizer's batch methods run in Rust threads.
    encoded = tokenizer(list(choices), add_special_tokens=False)["input_ids"]
    sequences = [[int(i) for i in ids] for ids in encoded]
    decoded = tokenizer.batch_decode(sequences, skip_special_tokens=True)
    for choice, ids, back in zip(choices, sequences, decoded, strict=True):
        if not ids:
            raise ValueError(f"choice {choice!r} tokenizes to nothing")
        if back != choice:
            raise ValueError(
                f"choice {choice!r} decodes back as {back!r} with this tokenizer; "
                "constrained decoding needs choices that round-trip exactly"
            )
    # A token prefix sorts right before the sequences it starts (everything between them
    # starts with it too), so neighbours in sorted order are the only pairs to compare:
    # O(n log n), where comparing every pair took seconds for a thousand choices.
    order = sorted(range(len(sequences)), key=lambda i: sequences[i])
    for a, b in zip(order, order[1:], strict=False):
        first, second = sequences[a], sequences[b]
        if len(first) <= len(second) and second[: len(first)] == first:
            raise ValueError(
                f"choice {choices[a]!r} is a token prefix of {choices[b]!r}; make the "
                "choices end distinctly (e.g. wrap them in closing tags)"
            )
    return sequences


DEFAULT_CACHE_BYTES = 16 << 20
"""16 MiB: the tokenized choice sets kept for reuse (a game's few dozen distinct sets)."""


class ChoiceCache:
    """Token ids of choice sets seen before, bounded in bytes, least recently used first
    out.

    Only a caller whose request succeeded :meth:`put` s its set, so choices that failed
    (a prompt over the context, a client's request cut short) leave nothing behind. A
    set larger than a quarter of the bound is never kept: it would evict everything else
    and is unlikely to come back.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._sets: OrderedDict[tuple[str, ...], tuple[list[list[int]], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sets)

    def get(self, choices: tuple[str, ...]) -> list[list[int]] | None:
        entry = self._sets.get(choices)
        if entry is None:
            return None
        self._sets.move_to_end(choices)
        return entry[0]

    def put(self, choices: tuple[str, ...], ids: list[list[int]]) -> None:
        if choices in self._sets:
            return
        # What the entry holds: the strings of its key, the lists and their int objects.
        size = sum(sys.getsizeof(c) for c in choices) + sum(64 + 36 * len(t) for t in ids)
        if size > self.max_bytes // 4:
            return
        self._sets[choices] = (ids, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self._sets.popitem(last=False)
            self.bytes -= dropped


def allowed_next(candidates: Sequence[Sequence[int]], prefix: Sequence[int]) -> list[int]:
    """Token ids that keep ``prefix`` on at least one candidate, sorted and distinct."""
    j = len(prefix)
    allowed = {int(c[j]) for c in candidates if len(c) > j and list(c[:j]) == list(prefix)}
    return sorted(allowed)


def is_complete(candidates: Sequence[Sequence[int]], response: Sequence[int]) -> bool:
    """Whether ``response`` equals one whole candidate."""
    return any(list(c) == list(response) for c in candidates)


def restricted_logprobs(
    logits: torch.Tensor, temperature: float, allowed: Sequence[int], explore: float = 0.0
) -> torch.Tensor:
    """Log-probs of one position's restricted distribution.

    Args:
        logits: Raw logits of one position, shape ``(V,)``.
        temperature: Sampling temperature; 0 uses the untempered logits (greedy
            convention).
        allowed: Allowed token ids (non-empty).
        explore: The uniform share of the exploration mixture
            (:func:`explored_logprobs`); 0 is the restricted softmax itself.

    Returns:
        Float32 ``(V,)``, ``-inf`` outside ``allowed``.
    """
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    index = torch.as_tensor(list(allowed), dtype=torch.long, device=logits.device)
    out = torch.full_like(scaled, float("-inf"))
    out[index] = torch.log_softmax(scaled[index], dim=-1)
    return explored_logprobs(out, allowed, explore)


def explored_logprobs(
    logprobs: torch.Tensor, allowed: Sequence[int], explore: float
) -> torch.Tensor:
    """Log-probs of ``(1 - explore) * p + explore * uniform(allowed)``.

    Args:
        logprobs: A restricted distribution's log-probs (any shape whose last axis is the
            vocabulary or the allowed tokens; ``-inf`` outside ``allowed``).
        allowed: The allowed token ids, or ``range(n)`` when the last axis holds only them.
        explore: The uniform share; 0 returns ``logprobs`` unchanged.
    """
    if explore <= 0 or len(allowed) < 2:
        return logprobs
    index = torch.as_tensor(list(allowed), dtype=torch.long, device=logprobs.device)
    out = logprobs.clone()
    out[..., index] = mixture_logprobs(logprobs[..., index], len(allowed), explore)
    return out


def mixture_logprobs(
    logprobs: torch.Tensor, n_allowed: torch.Tensor | int, explore: float
) -> torch.Tensor:
    """The behaviour policy of ``policy.explore``: ``log((1 - explore) * p + explore / n)``.

    The one place the exploration mixture is written; the engine samples from it, the
    learner's old log-probs and the language-model opponent's draws are computed by it.

    Args:
        logprobs: The policy's log-probs ``log p`` of the tokens, any shape.
        n_allowed: How many tokens were allowed at each of them (broadcast against
            ``logprobs``); where fewer than two, the token was forced and its log-prob
            is returned unchanged.
        explore: The uniform share; 0 returns ``logprobs`` itself.
    """
    if explore <= 0:
        return logprobs
    n = torch.as_tensor(n_allowed, device=logprobs.device).to(logprobs.dtype)
    mixed = torch.logaddexp(logprobs + math.log1p(-explore), torch.log(explore / n.clamp(min=1.0)))
    return torch.where(n >= 2, mixed, logprobs)


def allowed_index(allowed: Sequence[Sequence[Sequence[int]]], length: int) -> torch.Tensor | None:
    """Pack per-sample, per-position allowed sets into a ``(B, R, A)`` tensor.

    Args:
        allowed: For each sample, one allowed-id list per response token (an empty outer
            list, or an empty inner list, means unrestricted).
        length: ``R``, the padded response length.

    Returns:
        Int64 tensor padded with -1, or ``None`` when no position is restricted.
    """
    width = max((len(ids) for sample in allowed for ids in sample), default=0)
    if width == 0:
        return None
    index = torch.full((len(allowed), length, width), -1, dtype=torch.long)
    for b, sample in enumerate(allowed):
        for j, ids in enumerate(sample):
            if ids:
                index[b, j, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
    return index
