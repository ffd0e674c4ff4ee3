"""Extract the tagged parts of a model response.

Models answer with ``<action>...</action>`` on play turns and ``<remark>...</remark>`` on
reflect turns (SPEC §2). A model with a thinking mode may reason before the tag, and may
even mention a tag while thinking, so ``<think>...</think>`` blocks (and an unclosed one,
to the end) are dropped first and the *last* complete tag is the answer.

The scan is linear in the response: each search starts where the previous one stopped,
and a tag that is opened but never closed ends it. (A regular expression such as
``<action>(.*?)</action>`` retries from every opening tag and takes quadratic time on a
response made of thousands of unclosed tags: 42 s for 40,000.) Tags match ASCII
case-insensitively, and only the first :data:`MAX_RESPONSE_CHARS` characters of a
response are read.
"""

from __future__ import annotations

REFLECTION_MAX_CHARS = 2000
"""Reflections are cut to this many characters (SPEC §2)."""

MAX_RESPONSE_CHARS = 100_000
"""Responses are read up to this many characters; the rest is ignored. Far above any
``policy.max_tokens`` in use, it bounds the work one pathological answer can cost."""

# str.lower() may change a string's length (e.g. "İ" becomes two characters), which would
# shift every index found in the lowered copy; this mapping only touches A-Z.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _spans(folded: str, tag: str) -> list[tuple[int, int]]:
    """``(start, end)`` of the contents of each complete ``<tag>...</tag>``, left to right.

    Each match runs from the leftmost unmatched opening tag to the nearest closing tag
    after it, as a non-greedy regular expression would; ``folded`` is lower-case ASCII.
    """
    opening, closing = f"<{tag}>", f"</{tag}>"
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        start = folded.find(opening, pos)
        if start < 0:
            return spans
        start += len(opening)
        end = folded.find(closing, start)
        if end < 0:  # no closing tag after this one, so none after any later one either
            return spans
        spans.append((start, end))
        pos = end + len(closing)


def _strip_thinking_folded(text: str, folded: str) -> tuple[str, str]:
    opening, closing = "<think>", "</think>"
    kept: list[tuple[int, int]] = []
    pos = 0
    while True:
        start = folded.find(opening, pos)
        if start < 0:
            kept.append((pos, len(text)))
            break
        kept.append((pos, start))
        end = folded.find(closing, start + len(opening))
        if end < 0:  # an unclosed block runs to the end of the response
            break
        pos = end + len(closing)
    return "".join(text[a:b] for a, b in kept), "".join(folded[a:b] for a, b in kept)


def strip_thinking(text: str) -> str:
    """Drop ``<think>...</think>`` blocks (and an unclosed one, to the end)."""
    text = text[:MAX_RESPONSE_CHARS]
    return _strip_thinking_folded(text, text.translate(_ASCII_LOWER))[0]


def extract_tag(text: str, tag: str) -> str | None:
    """Return the stripped content of the last complete ``<tag>...</tag>``, or ``None``.

    Args:
        text: A model response; ``<think>`` blocks are ignored.
        tag: The tag name, lower-case ASCII (``action``, ``remark``).
    """
    text = text[:MAX_RESPONSE_CHARS]
    body, folded = _strip_thinking_folded(text, text.translate(_ASCII_LOWER))
    spans = _spans(folded, tag)
    if not spans:
        return None
    start, end = spans[-1]
    return body[start:end].strip()


def extract_action(text: str) -> str | None:
    """The content of the last ``<action>`` tag, or ``None`` when there is none."""
    return extract_tag(text, "action")


def extract_remark(text: str) -> str | None:
    """The reflection inside the last ``<remark>`` tag, cut to 2,000 characters."""
    remark = extract_tag(text, "remark")
    if remark is None:
        return None
    return remark[:REFLECTION_MAX_CHARS]
