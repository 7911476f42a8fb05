"""The Responses API's responses that are still running, by id, so that
POST /v1/responses/{id}/cancel can stop one: its engine requests are aborted, and the
response ends as "cancelled", the last event of its stream (or its body) and its stored
copy saying so. An entry goes when its response is done or its client has left."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from server.runtime.generation import ChoiceStream

CANCEL_WAIT_S = 30.0  # for the aborted request's last event: at most one engine step away
POLL_S = 0.05  # how often a cancel looks whether the client left instead


@dataclass
class Running:
    stream: ChoiceStream
    final: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def live(self) -> bool:
        return not self.final.done() and not self.stream.closed


class RunningResponses:
    def __init__(self) -> None:
        self.entries: dict[str, Running] = {}

    def add(self, response_id: str, stream: ChoiceStream) -> Running:
        """Track a response that has just started; those that ended are dropped here, so
        the table holds only live responses and a few just done."""
        self.entries = {key: entry for key, entry in self.entries.items() if entry.live}
        entry = self.entries[response_id] = Running(stream)
        return entry

    def finished(self, response_id: str, final: dict[str, Any]) -> None:
        entry = self.entries.pop(response_id, None)
        if entry is not None and not entry.final.done():
            entry.final.set_result(final)

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """The cancelled response, once its request has stopped; None when no response
        of that id is running."""
        entry = self.entries.get(response_id)
        if entry is None or not entry.live:
            return None
        entry.stream.cancel()
        deadline = asyncio.get_running_loop().time() + CANCEL_WAIT_S
        while not entry.final.done():
            if entry.stream.closed or asyncio.get_running_loop().time() > deadline:
                return None  # its client left as it was cancelled: nobody saw it end
            await asyncio.wait({entry.final}, timeout=POLL_S)
        return entry.final.result()
