"""Phi-4-mini's calls: `functools[{"name": ..., "arguments": {...}}, ...]`. Text before the
marker is content. vLLM reads the array with a non-greedy regex, which a `]` inside the
arguments cuts short, and does not stream; here the array is read as JSON, whole or while
it grows."""

from __future__ import annotations

from typing import ClassVar

from server.respond.tool_parsers.base import Call, ToolParser, array_calls, shown_content

FUNCTOOLS = "functools"


class Phi4MiniJsonParser(ToolParser):
    name: ClassVar[str] = "phi4_mini_json"

    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        content, found, rest = text.partition(FUNCTOOLS + "[")
        if not found:
            return shown_content(content, (FUNCTOOLS + "[",), final), []
        return content, array_calls("[" + rest, final) or []
