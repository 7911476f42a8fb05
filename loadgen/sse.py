"""Server-Sent Events through `httpx-sse`, a kept library instead of a hand-written parser.

`httpx-sse` splits lines on LF, CR and CRLF (whatever the network split), joins multi-line
`data:` fields with newlines, skips comments (`: ping`) and knows `retry:`. An event
that carries no data (a lone `retry:` or `id:` block) is not passed on: only data events
mean anything to a completion stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from httpx_sse import EventSource


@dataclass
class SSEEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


async def aiter_events(response: httpx.Response, t0: float) -> AsyncIterator[tuple[SSEEvent, float]]:
    """The response's data events with their arrival time, seconds after `t0` (perf_counter)."""
    async for sse in EventSource(response).aiter_sse():
        if sse.data == "" and sse.event == "message":
            continue
        yield SSEEvent(sse.data, sse.event, sse.id or None, sse.retry), time.perf_counter() - t0
