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
from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from mage_rl.policy.base import Message


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
    if not messages:
        raise ValueError("cannot render an empty chat: pass at least one message")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat_template; set one "
            "(mage_rl.policy.tiny.CHATML_TEMPLATE is ChatML) before generating"
        )
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    # The template already holds every special token the model expects (ChatML has no
    # BOS); letting the tokenizer add its own would put a second BOS in some vocabularies.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


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
