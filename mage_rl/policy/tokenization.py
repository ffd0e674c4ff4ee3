"""Prompt rendering, end-of-sequence ids and stop-string handling for the local engine.

The invariant the engine keeps, and tests check, is::

    tokenizer.decode(generation.response_ids, skip_special_tokens=True) == generation.text

so the learner trains on exactly the tokens whose text the agent acted on. Two
consequences:

* An EOS token that ends a response is in ``response_ids`` (the learner must learn to
  stop) but not in ``text`` (it is a special token).
* A stop string ends the response at the token that completes it; later tokens are
  dropped. When that last token runs past the stop string (``"</action>\\n"`` as a single
  token), the text keeps those extra characters rather than cutting a token in half, so
  parsers must search for the stop string, not assume the text ends with it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from mage_rl.policy.base import Message, RequestRejected


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> list[int]:
    """Token ids of ``messages`` rendered by the chat template, ready for the reply.

    Args:
        tokenizer: A tokenizer with a ``chat_template``.
        messages: ``{"role": ..., "content": ...}`` dicts.

    Returns:
        The prompt ids, ending with the assistant header (``add_generation_prompt=True``).

    Raises:
        ValueError: If the tokenizer has no chat template or ``messages`` is empty.
    """
    text = render_text(tokenizer, messages)
    # The template already holds every special token the model expects (ChatML has no
    # BOS); letting the tokenizer add its own would put a second BOS in some vocabularies.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_within(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Message],
    context: int,
    max_token_chars: int | None,
) -> list[int]:
    """:func:`render_prompt` for a model whose context holds ``context`` tokens.

    A text too long to fit is refused from its length alone when ``max_token_chars``
    (:func:`max_chars_per_token`) bounds it, before the tokenizer spends seconds and
    hundreds of MB on a prompt of a few MB.

    Raises:
        RequestRejected: The prompt leaves no room for a response in the context.
    """
    text = render_text(tokenizer, messages)
    if max_token_chars is not None and -(-len(text) // max_token_chars) >= context:
        raise RequestRejected(
            f"the prompt has {len(text)} characters, so at least "
            f"{-(-len(text) // max_token_chars)} tokens, but the model's context holds "
            f"{context}; shorten it (e.g. fewer or shorter texts in the chat)"
        )
    # Only the ids: each extra list (attention mask, ...) of a long text holds the
    # interpreter lock for as long again while it is built.
    ids = tokenizer(
        text, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False
    )["input_ids"]
    if len(ids) >= context:  # refused here, on the worker thread, not by its caller
        raise RequestRejected(
            f"prompt of {len(ids)} tokens leaves no room in the model's context of "
            f"{context} tokens; shorten the chat (e.g. fewer reflections)"
        )
    return list(ids)


def render_text(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message]) -> str:
    """The text of ``messages`` rendered by the chat template (what :func:`render_prompt`
    tokenizes), for callers that check its length first.

    Raises:
        ValueError: If the tokenizer has no chat template or ``messages`` is empty.
    """
    if not messages:
        raise ValueError("cannot render an empty chat: pass at least one message")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat_template; set one "
            "(mage_rl.policy.tiny.CHATML_TEMPLATE is ChatML) before generating"
        )
    return str(
        tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    )


# Unicode's longest canonical decomposition is 4 code points, so composing (NFC, NFKC)
# shortens a text at most 4 times; decomposing and lower-casing only lengthen it.
_UNICODE_FORMS = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1}
_KEEPING_SPLITS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}


def max_chars_per_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """A bound on the characters of text one token stands for, or ``None`` if unknown.

    A text of ``n`` characters then has at least ``ceil(n / bound)`` tokens, which lets
    a server refuse a prompt far over the context from its length alone, without
    tokenizing it. The bound is the longest vocabulary piece or added token (a byte-level
    piece spells each byte as one character, so it is never shorter than the text it
    covers), times 4 when the tokenizer composes Unicode first (NFC, NFKC).

    ``None`` (no bound: tokenize to know) for tokenizers that can drop text: a normalizer
    that strips or rewrites it (BERT's, SentencePiece's precompiled one), a pre-tokenizer
    that removes whitespace, a vocabulary that folds a long unknown span into one token
    (WordPiece, fused unknown tokens), or a tokenizer without a fast backend.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str())
    except (ValueError, AttributeError):
        return None
    factor = _normalizer_factor(spec.get("normalizer"))
    if factor is None or not _keeps_text(spec.get("pre_tokenizer")):
        return None
    model = spec.get("model") or {}
    kind = model.get("type")
    if kind == "BPE":
        byte_level = "ByteLevel" in json.dumps(spec.get("pre_tokenizer"))
        if model.get("fuse_unk") and not (byte_level or model.get("byte_fallback")):
            return None
        pieces = model.get("vocab") or {}
    elif kind == "Unigram":
        if not model.get("byte_fallback"):
            return None
        pieces = {piece: 0 for piece, _score in model.get("vocab") or []}
    else:
        return None
    longest = max((len(piece) for piece in pieces), default=0)
    added = max((len(t.get("content", "")) for t in spec.get("added_tokens") or []), default=0)
    return max(longest, added, 1) * factor


def _normalizer_factor(node: dict[str, Any] | None) -> int | None:
    """How many times a normalizer can shorten a text (``None``: without a bound)."""
    if node is None:
        return 1
    kind = node.get("type")
    if kind == "Sequence":
        factor = 1
        for part in node.get("normalizers") or []:
            inner = _normalizer_factor(part)
            if inner is None:
                return None
            factor *= inner
        return factor
    if kind == "Replace":
        pattern = (node.get("pattern") or {}).get("String")
        content = node.get("content") or ""
        return 1 if pattern is not None and len(content) >= len(pattern) else None
    return _UNICODE_FORMS.get(str(kind))


def _keeps_text(node: dict[str, Any] | None) -> bool:
    """Whether a pre-tokenizer keeps every character of the text in some piece."""
    if node is None:
        return True
    kind = node.get("type")
    if kind == "Sequence":
        return all(_keeps_text(part) for part in node.get("pretokenizers") or [])
    if kind in ("Split", "Punctuation"):
        return node.get("behavior") != "Removed"
    return kind in _KEEPING_SPLITS


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, generation_config: object = None) -> set[int]:
    """Ids that end a response.

    The union of the tokenizer's EOS, the generation config's EOS (an int or a list) and
    ``<|im_end|>`` when the vocabulary has it: ChatML models end a turn with it even when
    their declared EOS is ``<|endoftext|>`` (Qwen base models), and a response that ran
    past it would start writing the next turn.

    Args:
        tokenizer: The model's tokenizer.
        generation_config: The model's ``generation_config``, or ``None``.

    Returns:
        A non-empty set of token ids.

    Raises:
        ValueError: If no end-of-sequence id can be found.
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    config_eos = getattr(generation_config, "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif isinstance(config_eos, (list, tuple)):
        ids.update(int(i) for i in config_eos)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    if not ids:
        raise ValueError(
            "the tokenizer and generation config declare no EOS token; pass eos_token_ids= "
            "to LocalEngine"
        )
    return ids


def find_stop(text: str, stops: Sequence[str], search_from: int = 0) -> bool:
    """Whether ``text`` contains one of ``stops`` ending after ``search_from``.

    Args:
        text: Decoded response so far.
        stops: Stop strings.
        search_from: Offset from which a new occurrence may end; the caller passes the
            previous text length so that each step only scans the new tail.

    Returns:
        True when a stop string occurs.
    """
    for stop in stops:
        start = max(0, search_from - len(stop) + 1)
        if stop and text.find(stop, start) != -1:
            return True
    return False


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of special tokens: declared ones and added tokens marked special (ChatML's)."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids.update(int(i) for i, token in decoder.items() if getattr(token, "special", False))
    return ids


def token_bytes(tokenizer: PreTrainedTokenizerBase, token_id: int) -> bytes:
    """The bytes a token stands for, even when they are part of a multi-byte character.

        ``decode([token_id])`` turns a partial character into U+FFFD, whose UTF-8 bytes are
        not the token's. Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen, SmolLM2) spell each
        byte as one printable character, and SentencePiece's byte fallback spells it
        ``<0xE2>``; both are mapped back here. Special tokens give their text (their
    characters are printable ASCII, which byte-level vocabularies spell as themselves).

        Args:
            tokenizer: The model's tokenizer.
            token_id: A token id.

        Returns:
            The token's bytes; concatenating a response's token bytes gives the UTF-8 of its
            text (special tokens aside).
    """
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if not isinstance(piece, str):
        return str(tokenizer.decode([int(token_id)])).encode()
    if _is_byte_level(tokenizer) and all(c in _UNICODE_TO_BYTE for c in piece):
        return bytes(_UNICODE_TO_BYTE[c] for c in piece)
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        with contextlib.suppress(ValueError):
            return bytes([int(piece[3:5], 16)])
    return str(tokenizer.decode([int(token_id)])).encode()


def _is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and "ByteLevel" in repr(backend.decoder)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-printable-character table, inverted (character -> byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return {c: b for b, c in table.items()}


_UNICODE_TO_BYTE = _byte_alphabet()
