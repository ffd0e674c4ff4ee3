"""Token-level LLM access: local batched engine, endpoint client, LangChain adapter.

Heavy modules (torch, transformers, openai) are imported on first use of a name, so that
``import mage_rl.policy.base`` stays cheap and ``openai`` (an optional extra) is only
needed by :class:`OpenAIPolicy`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mage_rl.policy.base import Generation, Message, Policy, SamplingParams

if TYPE_CHECKING:
    from mage_rl.policy.chat_model import PolicyChatModel, generation_from_message
    from mage_rl.policy.engine import LocalEngine
    from mage_rl.policy.models import load_model
    from mage_rl.policy.openai_client import OpenAIPolicy
    from mage_rl.policy.scoring import teacher_forced_logprobs, token_logprobs
    from mage_rl.policy.tiny import build_tiny

_LAZY = {
    "LocalEngine": "mage_rl.policy.engine",
    "OpenAIPolicy": "mage_rl.policy.openai_client",
    "PolicyChatModel": "mage_rl.policy.chat_model",
    "build_tiny": "mage_rl.policy.tiny",
    "generation_from_message": "mage_rl.policy.chat_model",
    "load_model": "mage_rl.policy.models",
    "teacher_forced_logprobs": "mage_rl.policy.scoring",
    "token_logprobs": "mage_rl.policy.scoring",
}

__all__ = [
    "Generation",
    "LocalEngine",
    "Message",
    "OpenAIPolicy",
    "Policy",
    "PolicyChatModel",
    "SamplingParams",
    "build_tiny",
    "generation_from_message",
    "load_model",
    "teacher_forced_logprobs",
    "token_logprobs",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
