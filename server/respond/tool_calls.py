"""Turning the model's output into OpenAI `tool_calls`, whole or streamed.

Streaming: each call's first delta carries index, id, type and name with arguments "";
later deltas carry argument fragments. Fragments come from partial-json-parser: the
arguments parsed so far (incomplete strings and numbers left out), serialised, minus the
closing brackets that the parser added, which is always a prefix of the final arguments.
The prompt side (rendering tools, forcing calls) is server/translate/tool_prompt.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server.api.protocol import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from server.api.tool_markup import Mode
from server.respond.tool_parsers.base import ToolParser, item_call, parse_partial, parse_whole
from server.respond.tool_parsers.hermes import HermesParser


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def stable_prefix(serialised: str) -> str:
    """Drop the closing brackets that completing a partial parse added."""
    return serialised.rstrip("}]")


@dataclass
class CallState:
    id: str
    name_sent: bool = False
    arguments_sent: str = ""


class ToolCallStream:
    """One choice's output, fed as it grows; knows its content and its calls."""

    def __init__(self, mode: Mode, name: str | None = None,
                 parser: ToolParser | None = None) -> None:
        """`parser` reads the calls of "auto" (hermes when None); "required" and "named"
        outputs are the JSON their grammar forced, whatever the model's own format."""
        self.mode = mode
        self.name = name
        self.parser = parser or HermesParser()
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
        return self.parser.extract(self.text, final)

    def feed(self, text: str, final: bool) -> tuple[str, list[DeltaToolCall]]:
        """Add new output; return the content to show and the call deltas to send."""
        self.text += text
        content, calls = self.extract(final)
        if final and self.mode == "auto" and not usable(calls):
            content, calls = self.text, []  # as the whole response: a bad call is plain text
        new_content = content[len(self.content_sent):] if content.startswith(
            self.content_sent) else ""
        self.content_sent += new_content
        return new_content, self.call_deltas(calls, final)

    def call_deltas(self, calls: list[tuple[str | None, Any]], final: bool) -> list[DeltaToolCall]:
        deltas = []
        for index, (name, arguments) in enumerate(calls):
            if name is None:
                break  # a call is sent in order, once its name is known
            if index == len(self.calls):
                self.calls.append(CallState(self.parser.new_call_id()))
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
        if finish_reason == "length" or not calls or not usable(calls):
            return self.text, [], finish_reason
        tool_calls = [ToolCall(id=self.parser.new_call_id(), function=FunctionCall(
            name=name or "", arguments=dumps(arguments))) for name, arguments in calls]
        return content or None, tool_calls, self.finish_reason(finish_reason)

    def finish_reason(self, reason: str | None) -> str | None:
        if reason == "stop" and self.mode != "named" and (self.calls or self.extract(True)[1]):
            return "tool_calls"
        return reason


def usable(calls: list[tuple[str | None, Any]]) -> bool:
    """Every call has its name and its arguments: one that does not makes the output text."""
    return all(name is not None and arguments is not None for name, arguments in calls)
