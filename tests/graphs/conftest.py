from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import BaseMessage


class ScriptedChat(FakeListChatModel):
    """Answers play turns from one script and reflect turns from another, and keeps
    every prompt it saw."""

    reflections: list[str] = []
    seen: list[list[BaseMessage]] = []
    reflect_i: int = 0

    def _call(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> str:
        self.seen.append(messages)
        if "<remark>" in messages[-1].content:
            text = self.reflections[self.reflect_i % len(self.reflections)]
            self.reflect_i += 1
            return text
        return super()._call(messages, *args, **kwargs)
