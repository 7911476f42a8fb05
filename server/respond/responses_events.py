"""The chat output in the OpenAI Responses API's shape: a `response` object whose `output`
holds items (reasoning, message, function_call), or its stream of events, each with its
`type` and a `sequence_number`: response.created, response.in_progress, then per item
output_item.added, its parts and deltas (content_part.added, output_text.delta / .done,
content_part.done; reasoning_text.delta / .done; function_call_arguments.delta / .done),
output_item.done, and at last response.completed (response.incomplete when the output hit
max_output_tokens, response.cancelled when a cancel stopped it, response.failed when the
request failed after the stream started).

Items follow the output: reasoning, then text, then each tool call; a change of kind
closes the open item, as OpenAI's own streams never interleave items.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from server.api.errors import APIError
from server.api.protocol import UsageInfo
from server.api.responses_protocol import ResponsesRequest
from server.respond.dialect_streaming import Event, HeldSpace

Keep = Callable[[dict[str, Any]], None]  # stores a finished response
# A response's status by its chat finish reason: "abort" is a cancel (POST .../cancel)
FINAL_STATUS = {"length": "incomplete", "abort": "cancelled"}


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class OpenItem:
    kind: str  # "reasoning", "message" or "function_call"
    item: dict[str, Any]
    text: list[str] = field(default_factory=list)


def echoed_fields(body: ResponsesRequest) -> dict[str, Any]:
    """The request's settings, as a response repeats them."""
    fmt = body.text.format if body.text is not None and body.text.format is not None else None
    return {
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {}, "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None,
                      "summary": body.reasoning.summary if body.reasoning else None},
        "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt
                 else {"type": "text"}},
        "tool_choice": body.tool_choice or "auto", "tools": body.tools or [],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled", "user": body.user, "background": False}


class ResponsesDialect:
    def __init__(self, response_id: str, model: str, body: ResponsesRequest,
                 count_tokens: Callable[[str], int], keep: Keep | None) -> None:
        """`count_tokens` counts the reasoning's tokens; `keep` is handed the finished
        response (to store it, and to answer a cancel that waits for it)."""
        self.response_id = response_id
        self.model = model
        self.echo = echoed_fields(body)
        self.created_at = int(time.time())
        self.count_tokens = count_tokens
        self.keep = keep
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: OpenItem | None = None
        self.finish_reason: str | None = None
        self.held = HeldSpace()  # whitespace that would open a message item

    def response(self, status: str, usage: dict[str, Any] | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "status": status, "model": self.model, "output": list(self.output),
                "error": error, "incomplete_details": incomplete, "usage": usage, **self.echo}

    def event(self, kind: str, **data: Any) -> Event:
        self.sequence += 1
        return (kind, {"type": kind, "sequence_number": self.sequence - 1, **data})

    def start(self) -> list[Event]:
        created = self.response("in_progress")
        return [self.event("response.created", response=created),
                self.event("response.in_progress", response=created)]

    # ---- items ----

    def open_item(self, kind: str, item: dict[str, Any]) -> list[Event]:
        events = self.close_item()
        self.open = OpenItem(kind, item)
        index = len(self.output)
        events.append(self.event("response.output_item.added", output_index=index, item=item))
        part = self.part(kind, "")
        if part is not None:
            events.append(self.event("response.content_part.added", item_id=item["id"],
                                     output_index=index, content_index=0, part=part))
        return events

    @staticmethod
    def part(kind: str, text: str) -> dict[str, Any] | None:
        if kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return None

    def close_item(self) -> list[Event]:
        if self.open is None:
            return []
        kind, item, text = self.open.kind, self.open.item, "".join(self.open.text)
        self.open = None
        index = len(self.output)
        where = {"item_id": item["id"], "output_index": index}
        events: list[Event] = []
        if kind == "function_call":
            item = {**item, "arguments": text, "status": "completed"}
            events.append(self.event("response.function_call_arguments.done", **where,
                                     name=item["name"], arguments=text))
        else:
            part = self.part(kind, text)
            done = "response.output_text.done" if kind == "message" else "response.reasoning_text.done"
            extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
            events.append(self.event(done, **where, content_index=0, text=text, **extra))
            events.append(self.event("response.content_part.done", **where, content_index=0,
                                     part=part))
            item = {**item, "content": [part]}
            if kind == "message":
                item["status"] = "completed"
        self.output.append(item)
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events

    def add_text(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open.kind != kind:
            events += self.open_item(kind, new_item(kind))
        assert self.open is not None
        self.open.text.append(text)
        where = {"item_id": self.open.item["id"], "output_index": len(self.output)}
        if kind == "message":
            events.append(self.event("response.output_text.delta", **where, content_index=0,
                                     delta=text, logprobs=[]))
        else:
            events.append(self.event("response.reasoning_text.delta", **where, content_index=0,
                                     delta=text))
        return events

    def add_call(self, call: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        function = call.get("function") or {}
        if call.get("id") is not None:
            events += self.open_item("function_call", {
                "type": "function_call", "id": item_id("fc"), "call_id": call["id"],
                "name": function.get("name", ""), "arguments": "", "status": "in_progress"})
        if function.get("arguments") and self.open is not None and self.open.kind == "function_call":
            self.open.text.append(function["arguments"])
            events.append(self.event("response.function_call_arguments.delta",
                                     item_id=self.open.item["id"], output_index=len(self.output),
                                     delta=function["arguments"]))
        return events

    # ---- the Dialect protocol ----

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        events: list[Event] = []
        if delta.get("reasoning"):
            events += self.add_text("reasoning", delta["reasoning"])
        text = self.held.release(delta.get("content") or "",
                                 self.open is not None and self.open.kind == "message")
        if text:
            events += self.add_text("message", text)
        for call in delta.get("tool_calls") or []:
            events += self.add_call(call)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        return events

    def finish(self, usage: UsageInfo) -> list[Event]:
        """The last events; a cancelled response's is response.cancelled, named after its
        status as every other last event is (OpenAI documents none for it)."""
        events = self.close_item()
        final = self.finished(usage.model_dump(mode="json"))
        return [*events, self.event(f"response.{final['status']}", response=final)]

    def finished(self, chat_usage: dict[str, Any]) -> dict[str, Any]:
        status = FINAL_STATUS.get(self.finish_reason or "", "completed")
        if status == "incomplete":  # the output limit cut the last item, as OpenAI marks it
            self.output[-1:] = [{**item, "status": "incomplete"} if "status" in item else item
                                for item in self.output[-1:]]
        final = self.response(status, self.usage(chat_usage))
        if self.keep is not None:
            self.keep(final)
        return final

    def usage(self, chat_usage: dict[str, Any]) -> dict[str, Any]:
        cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        reasoning = "".join(part["text"] for item in self.output if item["type"] == "reasoning"
                            for part in item.get("content", []))
        return {"input_tokens": chat_usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": chat_usage["completion_tokens"],
                "output_tokens_details": {
                    "reasoning_tokens": self.count_tokens(reasoning) if reasoning else 0},
                "total_tokens": chat_usage["total_tokens"]}

    def fail(self, error: APIError) -> list[Event]:
        failed = self.response("failed", error={"code": "server_error" if error.status >= 500
                                                else "invalid_request", "message": error.message})
        return [self.event("response.failed", response=failed)]

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        choice = chat["choices"][0]
        message = choice["message"]
        if message.get("reasoning"):
            self.output.append({**new_item("reasoning"), "content": [
                {"type": "reasoning_text", "text": message["reasoning"]}]})
        if (message.get("content") or "").strip():
            self.output.append({**new_item("message"), "status": "completed", "content": [
                self.part("message", message["content"])]})
        for call in message.get("tool_calls") or []:
            self.output.append({"type": "function_call", "id": item_id("fc"),
                                "call_id": call["id"], "name": call["function"]["name"],
                                "arguments": call["function"]["arguments"], "status": "completed"})
        self.finish_reason = choice["finish_reason"]
        return self.finished(chat["usage"])


def new_item(kind: str) -> dict[str, Any]:
    if kind == "message":
        return {"type": "message", "id": item_id("msg"), "role": "assistant",
                "status": "in_progress", "content": []}
    return {"type": "reasoning", "id": item_id("rs"), "summary": [], "content": []}
