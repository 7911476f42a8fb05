"""DeepSeek-R1's reasoning: `<think>...</think>` then the answer. Its template writes the
opening tag into the prompt, so the output usually starts inside the reasoning; an output
with no `</think>` is all reasoning."""

from __future__ import annotations

from typing import ClassVar

from server.respond.reasoning.base import ReasoningParser, split_think


class DeepSeekR1Parser(ReasoningParser):
    name: ClassVar[str] = "deepseek_r1"

    def split(self, text: str, final: bool) -> tuple[str, str]:
        reasoning, content, _ = split_think(text, final)
        return reasoning, content
