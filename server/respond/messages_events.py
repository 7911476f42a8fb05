"""The chat output in the Anthropic Messages API's shape: a `message` body, or its stream
of events (message_start, ping, content_block_start / _delta / _stop per block,
message_delta with the stop reason and usage, message_stop; `error` if the request fails
after the stream started).

Blocks follow the output: reasoning opens a `thinking` block, content a `text` block, each
tool call a `tool_use` block whose arguments arrive as `input_json_delta`s; a change of kind
closes the open block, as Anthropic's own streams never interleave blocks.
"""

from __future__ import annotations

import json
from typing import Any

from server.api.anthropic_errors import anthropic_error_body
from server.api.errors import APIError
from server.api.protocol import UsageInfo
from server.respond.dialect_streaming import Event, HeldSpace


def stop_reason(finish_reason: str | None, matched: Any, stop_sequences: list[str],
                called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat finish reason and the stop that matched.
    `called`: the output holds tool calls (a forced call ends with chat's "stop", but an
    Anthropic client waits for "tool_use" to run it)."""
    if finish_reason == "tool_calls" or (called and finish_reason == "stop"):
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(matched, str) and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


def anthropic_usage(usage: dict[str, Any]) -> dict[str, int]:
    """Anthropic counts cache reads apart from input_tokens (their sum is the prompt)."""
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    return {"input_tokens": usage["prompt_tokens"] - cached,
            "output_tokens": usage["completion_tokens"],
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def parse_input(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}


class MessagesDialect:
    def __init__(self, message_id: str, model: str, input_tokens: int,
                 stop_sequences: list[str]) -> None:
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.stop_sequences = stop_sequences
        self.index = -1  # of the open block
        self.open_kind: str | None = None
        self.call_blocks: dict[int, int] = {}  # tool call index -> block index
        self.finish_reason: str | None = None
        self.matched_stop: Any = None
        self.held = HeldSpace()  # whitespace that would open a text block

    def message(self, content: list[dict[str, Any]], reason: str | None,
                sequence: str | None, usage: dict[str, int]) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "content": content, "model": self.model, "stop_reason": reason,
                "stop_sequence": sequence, "usage": usage}

    def start(self) -> list[Event]:
        usage = {"input_tokens": self.input_tokens, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        return [("message_start", {"type": "message_start",
                                   "message": self.message([], None, None, usage)}),
                ("ping", {"type": "ping"})]

    def open_block(self, kind: str, block: dict[str, Any]) -> list[Event]:
        events = self.close_block()
        self.index += 1
        self.open_kind = kind
        events.append(("content_block_start", {"type": "content_block_start",
                                               "index": self.index, "content_block": block}))
        return events

    def close_block(self) -> list[Event]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def delta(self, delta: dict[str, Any]) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                        "delta": delta})

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        events: list[Event] = []
        if delta.get("reasoning"):
            if self.open_kind != "thinking":
                events += self.open_block("thinking", {"type": "thinking", "thinking": "",
                                                       "signature": ""})
            events.append(self.delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
        text = self.held.release(delta.get("content") or "", self.open_kind == "text")
        if text:
            if self.open_kind != "text":
                events += self.open_block("text", {"type": "text", "text": ""})
            events.append(self.delta({"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or []:
            events += self.feed_call(call)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.matched_stop = choice.get("stop_reason")
        return events

    def feed_call(self, call: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        function = call.get("function") or {}
        if call.get("id") is not None:
            events += self.open_block("tool_use", {"type": "tool_use", "id": call["id"],
                                                   "name": function.get("name", ""), "input": {}})
            self.call_blocks[call["index"]] = self.index
        if function.get("arguments") and self.call_blocks.get(call["index"]) == self.index:
            events.append(self.delta({"type": "input_json_delta",
                                      "partial_json": function["arguments"]}))
        return events

    def finish(self, usage: UsageInfo) -> list[Event]:
        reason, sequence = stop_reason(self.finish_reason, self.matched_stop, self.stop_sequences,
                                       bool(self.call_blocks))
        return [*self.close_block(),
                ("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                   "usage": {"output_tokens": usage.completion_tokens}}),
                ("message_stop", {"type": "message_stop"})]

    def fail(self, error: APIError) -> list[Event]:
        return [("error", anthropic_error_body(error.status, error.message))]

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        choice = chat["choices"][0]
        message = choice["message"]
        content: list[dict[str, Any]] = []
        if message.get("reasoning"):
            content.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
        if (message.get("content") or "").strip():
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                            "input": parse_input(call["function"]["arguments"])})
        reason, sequence = stop_reason(choice["finish_reason"], choice.get("stop_reason"),
                                       self.stop_sequences, bool(message.get("tool_calls")))
        return self.message(content, reason, sequence, anthropic_usage(chat["usage"]))
