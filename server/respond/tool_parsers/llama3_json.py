"""Llama 3.x's JSON calls: an optional `<|python_tag|>`, then `{"name": ..., "parameters":
{...}}` objects (or "arguments"), several joined by `; `. As in vLLM, a call is recognised
only when the output starts with the tag or with `{`; anything else is content."""

from __future__ import annotations

from typing import ClassVar

from server.respond.tool_parsers.base import Call, ToolParser, decode_objects

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name: ClassVar[str] = "llama3_json"

    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        body = text.lstrip()
        if not final and PYTHON_TAG.startswith(body):
            return "", []  # perhaps the tag, still arriving
        tagged = body.startswith(PYTHON_TAG)
        body = body.removeprefix(PYTHON_TAG)
        if not tagged and not body.startswith("{"):
            return text, []
        calls = decode_objects(body, final)
        if calls is None:
            return ("", []) if not final else (text, [])
        return "", calls
