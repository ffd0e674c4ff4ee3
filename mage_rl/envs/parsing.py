"""Extract the tagged parts of a model response.

Models answer with ``<action>...</action>`` on play turns and ``<remark>...</remark>`` on
reflect turns (SPEC §2). A model with a thinking mode may reason before the tag, and may
even mention a tag while thinking, so the *last* complete tag is the answer.
"""

from __future__ import annotations

import re

REFLECTION_MAX_CHARS = 2000
"""Reflections are cut to this many characters (SPEC §2)."""

_TAG_CACHE: dict[str, re.Pattern[str]] = {}


def _pattern(tag: str) -> re.Pattern[str]:
    if tag not in _TAG_CACHE:
        _TAG_CACHE[tag] = re.compile(rf"<{tag}>(.*?)</{tag}>", re.IGNORECASE | re.DOTALL)
    return _TAG_CACHE[tag]


def strip_thinking(text: str) -> str:
    """Drop a ``<think>...</think>`` block (and an unclosed one) from a response."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.IGNORECASE | re.DOTALL)
    return re.sub(r"<think>.*\Z", "", text, flags=re.IGNORECASE | re.DOTALL)


def extract_tag(text: str, tag: str) -> str | None:
    """Return the stripped content of the last complete ``<tag>...</tag>``, or ``None``."""
    matches = _pattern(tag).findall(strip_thinking(text))
    if not matches:
        return None
    return matches[-1].strip()


def extract_action(text: str) -> str | None:
    """The content of the last ``<action>`` tag, or ``None`` when there is none."""
    return extract_tag(text, "action")


def extract_remark(text: str) -> str | None:
    """The reflection inside the last ``<remark>`` tag, cut to 2,000 characters."""
    remark = extract_tag(text, "remark")
    if remark is None:
        return None
    return remark[:REFLECTION_MAX_CHARS]
