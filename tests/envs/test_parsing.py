"""Tag extraction: same answers as a non-greedy regular expression, in linear time."""

from __future__ import annotations

import re
import time

import pytest

from mage_rl.envs.parsing import (
    MAX_RESPONSE_CHARS,
    extract_action,
    extract_remark,
    strip_thinking,
)


def _regex_action(text: str) -> str | None:
    """The former implementation, as the reference on ordinary answers."""
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.IGNORECASE | re.DOTALL)
    text = re.sub(r"<think>.*\Z", "", text, flags=re.IGNORECASE | re.DOTALL)
    found = re.findall(r"<action>(.*?)</action>", text, flags=re.IGNORECASE | re.DOTALL)
    return found[-1].strip() if found else None


@pytest.mark.parametrize(
    "text",
    [
        "<action>BET</action>",
        "I think so. <ACTION> pass </Action>",
        "<action>a</action> then <action>b</action>",
        "<action><action>x</action>",
        "<action>x</action><action>unclosed",
        "<think>maybe <action>BET</action></think> I check. <action>check</action>",
        "<think>never closed <action>BET</action>",
        "<THINK>a</THINK><think>b</think><action>(1, 2)</action><think>",
        "no tag at all",
        "</action><action>",
        "<action>\n up, left \n</action>",
        "",
    ],
)
def test_same_result_as_the_regular_expression(text: str) -> None:
    assert extract_action(text) == _regex_action(text)


def test_think_blocks_and_remarks() -> None:
    assert strip_thinking("a<think>b</think>c<think>d") == "ac"
    assert extract_remark("<remark>" + "r" * 3000 + "</remark>") == "r" * 2000
    assert extract_remark("<think><remark>no</remark></think>") is None


@pytest.mark.parametrize("tag", ["<action>", "<remark>", "<think>", "</action>"])
def test_forty_thousand_unclosed_tags_take_linear_time(tag: str) -> None:
    text = tag * 40_000
    start = time.perf_counter()
    for _ in range(5):
        assert extract_action(text) is None
        assert extract_remark(text) is None
        strip_thinking(text)
    # Measured at about 0.3 ms per call; the regular expression took 42 s at this size.
    assert (time.perf_counter() - start) / 5 < 0.05


def test_text_past_the_read_limit_is_ignored() -> None:
    assert extract_action("x" * MAX_RESPONSE_CHARS + "<action>BET</action>") is None
    padded = "x" * (MAX_RESPONSE_CHARS - 30) + "<action>BET</action>"
    assert extract_action(padded) == "BET"


def test_tags_match_ascii_case_only() -> None:
    # U+212A KELVIN SIGN folds to k under Unicode rules; the grammar is ASCII.
    assert extract_action("<action>BET</action><thin\u212a>") == "BET"
    assert extract_action("<ACTİON>BET</ACTİON>") is None
