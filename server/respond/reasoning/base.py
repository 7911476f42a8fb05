"""The interface of a reasoning format, and the `<think>` rules the formats share.

A parser is a pure function of the output so far: `split(text, final)` says which part is
reasoning and which is content. respond/reasoning/stream.py turns the difference between
two splits into deltas, so that whole and streamed responses say the same. While the output
is still growing, a parser shows nothing that might be the start of one of its tags.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from server.respond.tool_parsers.base import held_back

THINK_START, THINK_END = "<think>", "</think>"


class ReasoningParser(ABC):
    name: ClassVar[str]
    end_tag: ClassVar[str] = THINK_END  # structured outputs start after it

    def __init__(self, thinking: bool = True) -> None:
        """`thinking`: the request's chat_template_kwargs.enable_thinking (default true)."""
        self.thinking = thinking

    @property
    def active(self) -> bool:
        """Whether this request's output opens with reasoning at all."""
        return True

    @abstractmethod
    def split(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) of the output `text`."""


def split_think(text: str, final: bool) -> tuple[str, str, bool]:
    """The `<think>` rules: a leading `<think>` is dropped (the template may have written it
    into the prompt instead, so the output starts in reasoning either way), reasoning runs to
    the first `</think>`, and without one everything is reasoning. Returns (reasoning,
    content, ended)."""
    body = text.lstrip()
    if not final and THINK_START.startswith(body):
        return "", "", False  # nothing yet, or the start tag still arriving
    body = body.removeprefix(THINK_START)
    reasoning, found, content = body.partition(THINK_END)
    if found:
        return reasoning, content, True
    if final:
        return reasoning, "", False
    return reasoning[:len(reasoning) - held_back(reasoning, (THINK_END,))], "", False
