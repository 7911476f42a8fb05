"""The interface every tool-call format implements, and the JSON helpers they share.

A parser is a pure function of the output so far: `extract(text, final)` says what of it
is content and which calls it holds. respond/tool_calls.py feeds it the growing output and
turns the difference between two extractions into stream deltas, so a format is written
once for whole and streamed responses. While the output is still growing (`final` False),
a parser shows no content that might be the start of its call marker, and gives a call's
name only once the name is complete; arguments may be a partial parse.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import partial_json_parser
from partial_json_parser import Allow

# Containers may be open; strings, numbers and literals only once complete, so that a
# partial parse never shows half a name or half a number.
PARTIAL = Allow.OBJ | Allow.ARR

Call = tuple[str | None, Any]  # (name, arguments value); None: not known yet, or malformed
MALFORMED: Call = (None, None)


class ToolParser(ABC):
    """One model family's way of writing tool calls."""

    name: ClassVar[str]
    # The call markers are special tokens in the family's tokenizer ([TOOL_CALLS],
    # <|python_tag|>, ...): a detokenizer that skips special tokens would erase them.
    keeps_special_tokens: ClassVar[bool] = True

    @abstractmethod
    def extract(self, text: str, final: bool) -> tuple[str, list[Call]]:
        """(content, calls) of the output `text`; a call that cannot be read once it is
        complete is MALFORMED, which makes the whole output plain content."""

    def new_call_id(self) -> str:
        return f"chatcmpl-tool-{uuid.uuid4().hex}"


def parse_partial(text: str) -> Any:
    if not text.strip():
        return None
    try:
        return partial_json_parser.loads(text, PARTIAL)
    except Exception:  # noqa: BLE001 - malformed output is not a call
        return None


def parse_whole(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse(text: str, final: bool) -> Any:
    return parse_whole(text) if final else parse_partial(text)


def item_call(item: Any, key: str = "arguments") -> Call:
    """A {"name", "arguments"|"parameters"} object as a call; `key` is the one looked up first."""
    if not isinstance(item, dict):
        return MALFORMED
    name = item.get("name")
    other = "parameters" if key == "arguments" else "arguments"
    arguments = item[key] if key in item else item.get(other)
    return (name if isinstance(name, str) else None), arguments


def array_calls(text: str, final: bool) -> list[Call] | None:
    """The calls of a JSON array of call objects; None when the text is not such an array
    (or, while streaming, no array yet)."""
    value = parse(text, final)
    if not isinstance(value, list):
        return [MALFORMED] if final else None
    return [item_call(item) for item in value]


def held_back(content: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters might be the start of one of the markers."""
    longest = max(len(m) for m in markers)
    for size in range(min(len(content), longest - 1), 0, -1):
        tail = content[-size:]
        if any(m.startswith(tail) for m in markers):
            return size
    return 0


def shown_content(content: str, markers: tuple[str, ...], final: bool) -> str:
    return content if final else content[:len(content) - held_back(content, markers)]


def decode_objects(text: str, final: bool, separators: str = "; \n\t") -> list[Call] | None:
    """Call objects one after another (`{...}; {...}`); a last one still being written is
    parsed partially. None when the text does not start with an object."""
    decoder = json.JSONDecoder()
    calls: list[Call] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in separators:
            pos += 1
        if pos == len(text):
            return calls if calls or not final else None
        if text[pos] != "{":
            return calls + [MALFORMED] if calls or final else None
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            if final:
                return calls + [MALFORMED]
            return calls + [item_call(parse_partial(text[pos:]))]
        calls.append(item_call(value))
