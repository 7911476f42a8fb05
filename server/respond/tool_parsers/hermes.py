"""Hermes' format (Qwen 2.5 and Qwen3, and the prompt pagode writes for a template that
knows no tools): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, one per
call. Text before the first block is content; an unclosed last block is accepted. Without
any block, one bare generic JSON call (llama-server's generic form) is read as well."""

from __future__ import annotations

from typing import ClassVar

from server.api.tool_markup import CALL_END, CALL_START
from server.respond.tool_parsers.base import (
    MALFORMED,
    Call,
    ToolParser,
    item_call,
    parse,
    parse_whole,
    shown_content,
)


class HermesParser(ToolParser):
    name: ClassVar[str] = "hermes"

    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        content, found, rest = text.partition(CALL_START)
        if not found:
            return self.extract_generic(content, final)
        calls = []
        for block in rest.split(CALL_START):
            body, closed, _ = block.partition(CALL_END)
            value = parse(body, bool(closed) or final)
            if isinstance(value, dict):
                calls.append(item_call(value))
            elif closed or final:
                calls.append(MALFORMED)
        return content, calls

    @staticmethod
    def extract_generic(content: str, final: bool) -> tuple[str, list[Call]]:
        if final:
            generic = generic_calls(content)
            return ("", generic) if generic else (content, [])
        if content.lstrip().startswith("{"):
            return "", []  # perhaps a generic JSON call: decided at the end
        return shown_content(content, (CALL_START,), final), []


def generic_calls(content: str) -> list[Call]:
    """llama-server's generic form: {"tool_call": {...}}, {"tool_calls": [...]} or one call."""
    value = parse_whole(content.strip())
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("tool_calls"), list):
        items = value["tool_calls"]
    elif isinstance(value.get("tool_call"), dict):
        items = [value["tool_call"]]
    elif "name" in value and "arguments" in value:
        items = [value]
    else:
        return []
    return [item_call(i) for i in items]
