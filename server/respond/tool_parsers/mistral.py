"""Mistral's calls after the `[TOOL_CALLS]` token, in either of its two forms:

- before tokenizer v11: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, a JSON array;
- v11 and later: `[TOOL_CALLS]name[ARGS]{...}` (or `name{...}`), repeated per parallel call.

Text before the first `[TOOL_CALLS]` is content. Call ids are 9 alphanumeric characters, as
Mistral's chat template requires of the ids it reads back."""

from __future__ import annotations

import secrets
import string
from typing import ClassVar

from server.respond.tool_parsers.base import (
    MALFORMED,
    Call,
    ToolParser,
    array_calls,
    parse,
    shown_content,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
ID_ALPHABET = string.ascii_letters + string.digits


class MistralParser(ToolParser):
    name: ClassVar[str] = "mistral"

    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        content, found, rest = text.partition(TOOL_CALLS)
        if not found:
            return shown_content(content, (TOOL_CALLS,), final), []
        segments = rest.split(TOOL_CALLS)
        calls: list[Call] = []
        for i, segment in enumerate(segments):
            last = i == len(segments) - 1
            calls += segment_calls(segment, final or not last)
        return content, calls

    def new_call_id(self) -> str:
        return "".join(secrets.choice(ID_ALPHABET) for _ in range(9))


def segment_calls(segment: str, complete: bool) -> list[Call]:
    """The calls after one [TOOL_CALLS]: an array, or one name with its arguments."""
    body = segment.strip()
    if body.startswith("["):
        return array_calls(body, complete) or []
    name, marker, arguments = split_named(body)
    if not marker:
        return [MALFORMED] if complete else []
    value = parse(arguments, complete)
    if complete and not isinstance(value, dict):
        return [MALFORMED]
    return [(name, value)]


def split_named(body: str) -> tuple[str, str, str]:
    """`name[ARGS]{...}` or `name{...}` -> (name, marker, arguments); no marker yet: ("", "", "")."""
    cut = [i for i in (body.find(ARGS), body.find("{")) if i >= 0]
    if not cut:
        return "", "", ""
    at = min(cut)
    marker = ARGS if body.startswith(ARGS, at) else "{"
    arguments = body[at + len(ARGS):] if marker == ARGS else body[at:]
    return body[:at].strip(), marker, arguments
