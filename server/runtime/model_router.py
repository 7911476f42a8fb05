"""Routing by the body's `model` when one server serves several models (llama.cpp's router
reads the same field): before a POST reaches its route, the model it names is loaded if it
is not, and pinned until the response has been sent, streams included.

It sits as ASGI middleware, not in each route, so every endpoint that takes a `model` (the
OpenAI, Anthropic and pooling ones alike) waits for its model the same way, and the pin
covers the whole response, which a route returning a stream does not see the end of. A body
that is not JSON or names no known model passes through untouched: the route answers it (its
400, or OpenAI's 404 for an unknown model) as it would with one model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.errors import error_response
from server.runtime.model_registry import LoadRefused, ModelRegistry


class ModelRouter:
    def __init__(self, app: ASGIApp, registry: ModelRegistry, max_body_bytes: int, body_timeout_s: float) -> None:
        """A body is read here up to the limits the route enforces; past them it goes on to the
        route unread, which answers the 413 or 408 as it would with one model."""
        self.app = app
        self.registry = registry
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].startswith("/models/"):
            await self.app(scope, receive, send)
            return
        read = BodyRead()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.body_timeout_s):
                await read.fill(receive, self.max_body_bytes)
        model = self.registry.find(named_model(read.body)) if read.complete else None
        replay = read.replaying(receive)
        if model is None:
            await self.app(scope, replay, send)
            return
        try:
            async with self.registry.pinned(model):
                await self.app(scope, replay, send)
        except LoadRefused as err:  # before the route ran: no room, or the load failed
            await error_response(err.status, err.message, err.param, err.headers, scope["path"])(scope, replay, send)


class BodyRead:
    """The request's first messages, read here and handed to the route again unchanged."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.complete = False  # the whole body is here

    async def fill(self, receive: Receive, limit: int) -> None:
        size = 0
        while size <= limit:
            message = await receive()
            self.messages.append(message)
            if message["type"] != "http.request":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.complete = size <= limit
                return

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.request")

    def replaying(self, receive: Receive) -> Receive:
        """A receive that gives the messages read here, then the client's own."""
        pending = list(self.messages)

        async def replay() -> Message:
            return pending.pop(0) if pending else await receive()

        return replay


def named_model(body: bytes) -> str | None:
    """The `model` a JSON body names; None when it names none (the default model)."""
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None
