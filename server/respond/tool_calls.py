"""Turning the model's output into OpenAI `tool_calls`, whole or streamed.

Streaming: each call's first delta carries index, id, type and name with arguments "";
later deltas carry argument fragments. Fragments come from partial-json-parser: the
arguments parsed so far (incomplete strings and numbers left out), serialised, minus the
closing brackets that the parser added, which is always a prefix of the final arguments.
The prompt side (rendering tools, forcing calls) is server/translate/tool_prompt.py.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import partial_json_parser
from partial_json_parser import Allow

from server.api.protocol import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from server.api.tool_markup import CALL_END, CALL_START, Mode

PARTIAL = Allow.OBJ | Allow.ARR  # containers may be open; strings, numbers, literals complete


# ---- parsing, whole and streamed -----------------------------------------------------------

def new_call_id() -> str:
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


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def stable_prefix(serialised: str) -> str:
    """Drop the closing brackets that completing a partial parse added."""
    return serialised.rstrip("}]")


def held_back(content: str) -> int:
    """How many trailing characters might be the start of CALL_START."""
    for size in range(min(len(content), len(CALL_START) - 1), 0, -1):
        if CALL_START.startswith(content[-size:]):
            return size
    return 0


@dataclass
class CallState:
    id: str = field(default_factory=new_call_id)
    name_sent: bool = False
    arguments_sent: str = ""


class ToolCallStream:
    """One choice's output, fed as it grows; knows its content and its calls."""

    def __init__(self, mode: Mode, name: str | None = None) -> None:
        self.mode = mode
        self.name = name
        self.text = ""
        self.content_sent = ""
        self.calls: list[CallState] = []

    # What the output says so far: visible content and [(name, arguments value)].
    def extract(self, final: bool) -> tuple[str, list[tuple[str | None, Any]]]:
        parse = parse_whole if final else parse_partial
        if self.mode == "named":
            return "", [(self.name, parse(self.text))]
        if self.mode == "required":
            value = parse(self.text)
            items = value if isinstance(value, list) else []
            return "", [item_call(item, "parameters") for item in items if isinstance(item, dict)]
        return self.extract_auto(final)

    def extract_auto(self, final: bool) -> tuple[str, list[tuple[str | None, Any]]]:
        content, _, rest = self.text.partition(CALL_START)
        if not rest and CALL_START not in self.text:
            if final:
                generic = generic_calls(content)
                return ("", generic) if generic else (content, [])
            if content.lstrip().startswith("{"):
                return "", []  # perhaps a generic JSON call: decided at the end
            return content[:len(content) - held_back(content)], []
        calls = []
        for block in rest.split(CALL_START):
            body, closed, _ = block.partition(CALL_END)
            value = parse_whole(body) if (closed or final) else parse_partial(body)
            if isinstance(value, dict):
                calls.append(item_call(value, "arguments"))
        return content.rstrip(), calls

    def feed(self, text: str, final: bool) -> tuple[str, list[DeltaToolCall]]:
        """Add new output; return the content to show and the call deltas to send."""
        self.text += text
        content, calls = self.extract(final)
        new_content = content[len(self.content_sent):] if content.startswith(
            self.content_sent) else ""
        self.content_sent += new_content
        return new_content, self.call_deltas(calls, final)

    def call_deltas(self, calls: list[tuple[str | None, Any]], final: bool) -> list[DeltaToolCall]:
        deltas = []
        for index, (name, arguments) in enumerate(calls):
            if name is None:
                continue
            if index == len(self.calls):
                self.calls.append(CallState())
            state = self.calls[index]
            delta = DeltaToolCall(index=index, function=DeltaFunctionCall())
            if not state.name_sent:
                state.name_sent = True
                delta.id, delta.type = state.id, "function"
                delta.function.name, delta.function.arguments = name, ""
            if arguments is not None:
                target = dumps(arguments)
                target = target if final else stable_prefix(target)
                if target.startswith(state.arguments_sent) and len(target) > len(
                        state.arguments_sent):
                    delta.function.arguments = (delta.function.arguments or "") + target[
                        len(state.arguments_sent):]
                    state.arguments_sent = target
            if delta.id is not None or delta.function.arguments:
                deltas.append(delta)
        return deltas

    def result(self, text: str, finish_reason: str | None) -> tuple[str | None, list[ToolCall], str | None]:
        """Non-streaming: (content, calls, finish_reason) of the whole output `text`."""
        self.text = text
        content, calls = self.extract(final=True)
        if finish_reason == "length" or not calls or any(a is None for _, a in calls):
            return self.text, [], finish_reason
        tool_calls = [ToolCall(id=new_call_id(), function=FunctionCall(
            name=name or "", arguments=dumps(arguments))) for name, arguments in calls]
        return content or None, tool_calls, self.finish_reason(finish_reason)

    def finish_reason(self, reason: str | None) -> str | None:
        if reason == "stop" and self.mode != "named" and (self.calls or self.extract(True)[1]):
            return "tool_calls"
        return reason


def item_call(item: dict[str, Any], key: str) -> tuple[str | None, Any]:
    name = item.get("name")
    arguments = item.get(key, item.get("arguments" if key == "parameters" else "parameters"))
    return (name if isinstance(name, str) else None), arguments


def generic_calls(content: str) -> list[tuple[str | None, Any]]:
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
    return [item_call(i, "arguments") for i in items if isinstance(i, dict)]
