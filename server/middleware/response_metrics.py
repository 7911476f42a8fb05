"""Counting every HTTP response by status code and error type (pure ASGI, so streams and
disconnects pass untouched); ServerMetrics exposes the counts as pagode:http_responses_total."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.runtime.state import ServerState


class ResponseCountMiddleware:
    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.count_response(int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)
