"""Sending a chat request's output in another API's dialect (Anthropic Messages, OpenAI
Responses): the ChatBuilder reads the engine's deltas exactly as for chat, and a dialect
turns its chunks into that API's named SSE events, or its whole response into that API's
body. The stream's lifetime (close once, abort on disconnect, send timeout) is chat's."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.types import Scope

from server.api.errors import APIError
from server.api.protocol import UsageInfo
from server.respond.builders import ChatBuilder
from server.respond.streaming import full_response, to_json
from server.runtime.generation import ChoiceStream
from server.runtime.response_stats import ResponseStats

Event = tuple[str, dict[str, Any]]  # (event name, data)


class HeldSpace:
    """Whitespace alone does not open a text block or a message item (a reasoning model
    writes a blank line between its thinking and its call): it waits for the text that
    follows it, and is dropped if none does."""

    def __init__(self) -> None:
        self.space = ""

    def release(self, text: str, opened: bool) -> str:
        """The text to send now; `opened`: the block or item that text goes to is open."""
        if opened:
            return text
        self.space += text
        if not self.space.strip():
            return ""
        text, self.space = self.space, ""
        return text


class Dialect(Protocol):
    def start(self) -> list[Event]:
        """The events before any output."""

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """The events of one chat chunk (its one choice's delta and finish reason)."""

    def finish(self, usage: UsageInfo) -> list[Event]:
        """The events that close a stream that ended well."""

    def fail(self, error: APIError) -> list[Event]:
        """The events that close a stream whose request failed after it started."""

    def whole(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed body, from the chat completion's."""


def sse(events: list[Event]) -> list[dict[str, str]]:
    return [{"event": name, "data": to_json(data)} for name, data in events]


async def dialect_events(stream: ChoiceStream, builder: ChatBuilder, dialect: Dialect,
                         stats: ResponseStats, scope: Scope) -> AsyncIterator[dict[str, str]]:
    try:
        for item in sse(dialect.start()):
            yield item
        async for event in stream:
            if event.error is not None:
                stats.count(event.error.status, scope, in_stream=True)
                for item in sse(dialect.fail(event.error)):
                    yield item
                return
            start = time.perf_counter()
            chunk = builder.chunk(event)
            items = sse(dialect.feed(chunk)) if chunk is not None else []
            stats.add_encode_time(time.perf_counter() - start)
            for item in items:
                yield item
        for item in sse(dialect.finish(builder.usage())):
            yield item
    finally:
        stream.close()  # synchronous: this may run inside a cancelled scope


async def respond_in_dialect(request: Request, streamed: bool, stream: ChoiceStream,
                             builder: ChatBuilder, dialect: Dialect, send_timeout_s: float,
                             stats: ResponseStats) -> Response:
    if not streamed:
        return await full_response(request, stream, builder, dialect.whole)
    # sep="\n": frames are "event: ...\ndata: ...\n\n", as both APIs send them.
    return EventSourceResponse(dialect_events(stream, builder, dialect, stats, request.scope), sep="\n",
                               background=BackgroundTask(stream.close),
                               send_timeout=send_timeout_s)
