"""The one reader of a POST body before its route: the `model` it names, parsed once, decides
which model serves the request and which LoRA adapter it runs on.

- **Several models** (llama.cpp's router reads the same field): the model the body names is
  loaded if it is not, and pinned until the response has been sent, streams included.
- **Adapters** (vLLM's rule): a `model` that names an adapter of a loaded model, not a model,
  runs the request on that adapter (server/runtime/adapter_routing.py), kept for the length of
  the request (server/runtime/request_adapter.py).

It sits as ASGI middleware, not in each route, so every endpoint that takes a `model`
(the OpenAI, Anthropic, Responses and pooling ones alike) is routed the same way, and the pin
covers the whole response, which a route returning a stream does not see the end of. A body
that is not JSON or names no known model passes through untouched: the route answers it (its
400, or OpenAI's 404 for an unknown model) as it would with one model. The route parses the
body as its own request type; this reads the one field, once, for every route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.api.errors import error_response
from server.runtime.adapter_routing import adapter_named
from server.runtime.model_registry import LoadRefused, ModelRegistry
from server.runtime.request_adapter import REQUESTED_ADAPTER


class ModelRouter:
    def __init__(self, app: ASGIApp, registry: ModelRegistry, max_body_bytes: int, body_timeout_s: float,
                 pin_models: bool, route_adapters: bool) -> None:
        """`pin_models`: the server has several models; `route_adapters`: one of them serves
        adapters. A body is read here up to the limits the route enforces; past them it goes
        on to the route unread, which answers the 413 or 408 as it would with one model."""
        self.app = app
        self.registry = registry
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.pin_models = pin_models
        self.route_adapters = route_adapters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].startswith("/models/"):
            await self.app(scope, receive, send)
            return
        read = BodyRead()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.body_timeout_s):
                await read.fill(receive, self.max_body_bytes)
        name = named_model(read.body) if read.complete else None
        replay = read.replaying(receive)
        adapter = self.adapter_for(scope["path"], name)
        model = self.registry.find(name) if self.pin_models and read.complete else None  # no name: the default
        token = REQUESTED_ADAPTER.set(adapter)
        try:
            if model is None:
                await self.app(scope, replay, send)
                return
            async with self.registry.pinned(model):
                await self.app(scope, replay, send)
        except LoadRefused as err:  # before the route ran: no room, or the load failed
            await error_response(err.status, err.message, err.param, err.headers, scope["path"])(scope, replay, send)
        finally:
            REQUESTED_ADAPTER.reset(token)

    def adapter_for(self, path: str, name: str | None) -> str | None:
        """The adapter a generation endpoint's request runs on (the /v1/ routes take one)."""
        if not self.route_adapters or not path.startswith("/v1/"):
            return None
        return adapter_named(self.registry, name)


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
