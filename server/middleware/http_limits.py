"""Connection-level defences that uvicorn lacks, for slow and hostile clients.

- `HeaderLimitMiddleware` (ASGI): a request whose header block exceeds --max-header-bytes
  gets 431 before any route runs.
- `TimedH11Protocol` (uvicorn's h11 protocol): a connection must deliver a whole request
  head within --header-timeout seconds of connecting (or of its previous response), or it
  is closed. uvicorn only times out idle keep-alive connections, so 20 clients sending half
  a header would otherwise hold 20 connections forever.

uvicorn's own `limit_concurrency` (503 past N connections + tasks) and
`timeout_keep_alive` are set from flags in server/cli.py; the body deadline is in
server/api/body.py and the SSE send timeout in server/respond/streaming.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from server.api.errors import error_response


class HeaderLimitMiddleware:
    def __init__(self, app: ASGIApp, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            size = sum(len(k) + len(v) + 4 for k, v in scope["headers"])
            if size > self.max_header_bytes:
                response = error_response(
                    431, f"The request headers are {size} bytes; the limit is "
                    f"{self.max_header_bytes} (--max-header-bytes).",
                    headers={"Connection": "close"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def timed_h11_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on each request head."""

    class TimedH11Protocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.arm_head_timer()

        def arm_head_timer(self) -> None:
            self.cancel_head_timer()
            self.head_timer = self.loop.call_later(header_timeout_s, self.head_timed_out)

        def cancel_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def head_timed_out(self) -> None:
            self.head_timer = None
            if self.cycle is None or self.cycle.response_complete:
                self.logger.info("closing a connection that sent no whole request head "
                                 "within %.1fs", header_timeout_s)
                self.transport.close()

        def handle_events(self) -> None:
            waiting_for_head = self.cycle is None or self.cycle.response_complete
            super().handle_events()
            if waiting_for_head and self.cycle is not None and not self.cycle.response_complete:
                self.cancel_head_timer()  # a request head arrived

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self.cancel_head_timer()
            super().connection_lost(exc)

    return TimedH11Protocol
