"""Qwen3's reasoning: as DeepSeek-R1's `<think>...</think>`, but switched by the request's
`chat_template_kwargs.enable_thinking` (default true), which the template reads too: with
false, the template writes an empty think block into the prompt and the whole output is
content. A second `</think>` in the content is dropped, as vLLM does."""

from __future__ import annotations

from typing import ClassVar

from server.respond.reasoning.base import THINK_END, ReasoningParser, split_think
from server.respond.tool_parsers.base import shown_content


class Qwen3Parser(ReasoningParser):
    name: ClassVar[str] = "qwen3"

    @property
    def active(self) -> bool:
        return self.thinking

    def split(self, text: str, final: bool) -> tuple[str, str]:
        if not self.thinking:
            return "", text
        reasoning, content, _ = split_think(text, final)
        content = shown_content(content, (THINK_END,), final)
        return reasoning, content.replace(THINK_END, "")
