"""Granite's calls: a JSON array after `<|tool_call|>` (Granite 3.0) or `<tool_call>`
(Granite 3.1), with no closing tag. Text before the marker is content."""

from __future__ import annotations

from typing import ClassVar

from server.respond.tool_parsers.base import Call, ToolParser, array_calls, shown_content

MARKERS = ("<|tool_call|>", "<tool_call>")


class GraniteParser(ToolParser):
    name: ClassVar[str] = "granite"

    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        found = [(text.find(m), m) for m in MARKERS if m in text]
        if not found:
            return shown_content(text, MARKERS, final), []
        at, marker = min(found)
        return text[:at], array_calls(text[at + len(marker):].strip(), final) or []
