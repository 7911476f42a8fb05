"""Connection-level defences that uvicorn lacks, for slow and hostile clients.

- `HeaderLimitMiddleware` (ASGI): a request whose header block exceeds --max-header-bytes
  gets 431 before any route runs.
- `TimedH11Protocol` (uvicorn's h11 protocol): a connection must deliver a whole request
  head within --header-timeout seconds of connecting (or of its previous response), or it
  is closed. uvicorn only times out idle keep-alive connections, so 20 clients sending half
  a header would otherwise hold 20 connections forever.
- Lingering close, as nginx's: when the server answers before the client has sent its
  whole body (413 on a 16 MiB body, 415) and closes, closing at once with unread bytes in
  the socket makes the kernel send a reset, and the client loses the answer it has not read
  yet. So the server half-closes (FIN after the answer), reads and discards what still
  comes for a bounded time and size, then closes.

uvicorn's own `limit_concurrency` (503 past N connections + tasks) and
`timeout_keep_alive` are set from flags in server/cli.py; the body deadline is in
server/api/body.py and the SSE send timeout in server/respond/streaming.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
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
                    headers={"Connection": "close"}, path=scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


LINGER_IDLE_S = 2.0  # nginx's lingering_timeout: at most this long between two reads
LINGER_MAX_S = 10.0  # nginx's lingering_time: at most this long in all
LINGER_MAX_BYTES = 256 * 2**20  # then close anyway


class LingeringTransport:
    """The connection's transport as uvicorn sees it: `close()` lingers while the client is
    still sending its body; everything else goes to the real transport."""

    def __init__(self, transport: Any, protocol: Any) -> None:
        self.real = transport
        self.protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def close(self) -> None:
        if self.protocol.lingering:
            return  # stop_lingering closes the real transport
        if self.protocol.client_still_sending():
            self.protocol.start_lingering()
        else:
            self.real.close()

    def is_closing(self) -> bool:
        return bool(self.protocol.lingering or self.real.is_closing())


def timed_h11_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on each request head and a lingering close."""

    class TimedH11Protocol(H11Protocol):
        head_timer: asyncio.TimerHandle | None = None
        lingering = False
        linger_timer: asyncio.TimerHandle | None = None
        linger_deadline = 0.0
        linger_bytes = 0

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(LingeringTransport(transport, self))  # type: ignore[arg-type]
            self.arm_head_timer()

        def real_transport(self) -> Any:
            return self.transport.real  # type: ignore[attr-defined]

        def client_still_sending(self) -> bool:
            return bool(self.conn.their_state is h11.SEND_BODY)

        def start_lingering(self) -> None:
            """Half-close after the answer, then read and discard until the client is done."""
            self.lingering = True
            self.cancel_head_timer()
            real = self.real_transport()
            if real.can_write_eof():
                real.write_eof()  # sent once the answer has left the buffer
            real.resume_reading()
            self.linger_deadline = self.loop.time() + LINGER_MAX_S
            self.arm_linger_timer()

        def arm_linger_timer(self) -> None:
            if self.linger_timer is not None:
                self.linger_timer.cancel()
            self.linger_timer = self.loop.call_later(LINGER_IDLE_S, self.stop_lingering)

        def stop_lingering(self) -> None:
            if self.linger_timer is not None:
                self.linger_timer.cancel()
                self.linger_timer = None
            self.real_transport().close()

        def data_received(self, data: bytes) -> None:
            if not self.lingering:
                super().data_received(data)
                return
            self.linger_bytes += len(data)
            if (self.linger_bytes > LINGER_MAX_BYTES
                    or self.loop.time() > self.linger_deadline):
                self.stop_lingering()
            else:
                self.arm_linger_timer()

        def eof_received(self) -> None:
            if self.lingering:
                self.stop_lingering()
                return
            super().eof_received()

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
            if self.linger_timer is not None:
                self.linger_timer.cancel()
            super().connection_lost(exc)

    return TimedH11Protocol
