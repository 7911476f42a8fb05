"""Which LoRA adapter a request runs on: the body's `model`, when it names an adapter of a
loaded model rather than a model (vLLM's rule).

The name is read once here, as ASGI middleware, for every endpoint that takes a `model` (the
OpenAI, Anthropic and Responses ones alike), and kept for the length of the request
(server/runtime/request_adapter.py).
Admission resolves the same name to the adapter's base model (ServedModel.answers_to), and
answers OpenAI's 404 for a name that is neither.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Receive, Scope, Send

from server.runtime.model_registry import ModelRegistry
from server.runtime.model_router import BodyRead, named_model
from server.runtime.request_adapter import REQUESTED_ADAPTER


class AdapterRouter:
    def __init__(self, app: ASGIApp, registry: ModelRegistry, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.registry = registry
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        read = BodyRead()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.body_timeout_s):
                await read.fill(receive, self.max_body_bytes)
        adapter = self.adapter_named(named_model(read.body)) if read.complete else None
        token = REQUESTED_ADAPTER.set(adapter)
        try:
            await self.app(scope, read.replaying(receive), send)
        finally:
            REQUESTED_ADAPTER.reset(token)

    def adapter_named(self, name: str | None) -> str | None:
        """`name` if it is an adapter of a loaded model and no model's own name."""
        if name is None or any(m.name == name for m in self.registry.models):
            return None
        for model in self.registry.loaded():
            if model.engine is not None and name in model.engine.lora_adapters():
                return name
        return None
