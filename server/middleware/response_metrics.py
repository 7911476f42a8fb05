"""Counting every HTTP response by its status and endpoint (pure ASGI, so streams and
disconnects pass untouched); the runtime keeps the counts and serves them as
pagode:http_responses_total and, per endpoint, http_requests_total."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ResponseCountMiddleware:
    def __init__(self, app: ASGIApp, count: Callable[[int, Scope], None]) -> None:
        self.app = app
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.count(int(message["status"]), scope)
            await send(message)

        await self.app(scope, receive, counting_send)
