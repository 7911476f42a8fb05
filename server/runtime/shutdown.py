"""Graceful shutdown: on SIGTERM (or a first Ctrl+C) stop taking work, let in-flight
requests finish for up to --shutdown-timeout seconds, abort the rest (their choices end
with finish_reason "abort"), then let uvicorn close and exit 0. A second signal during the
drain aborts them at once.

uvicorn's own handler would stop accepting connections at once and re-raise the signal
after shutdown (exit status -15); this subclass replaces it so that new requests still get
an honest 503 while the drain runs.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from server.runtime.state import ServerState

logger = logging.getLogger("pagode.server")
ABORT_GRACE_S = 5.0  # after aborting, time for the aborted streams to send their last event


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, get_state: Callable[[], ServerState],
                 shutdown_timeout: float) -> None:
        super().__init__(config)
        self.get_state = get_state
        self.shutdown_timeout = shutdown_timeout
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def request_exit(self) -> None:
        """Stop without draining (the engine failed to load: there is nothing to drain)."""
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (main thread): start the drain; a second signal exits now."""
        if self.loop is None:
            self.should_exit = True
            return
        if self.drain_task is not None:
            self.loop.call_soon_threadsafe(self.exit_now, sig)
            return
        self.loop.call_soon_threadsafe(self.start_drain, sig)

    def exit_now(self, sig: int) -> None:
        """Abort what still runs, as the drain's timeout would: otherwise uvicorn's own
        shutdown would wait for the open streams to end (up to timeout_graceful_shutdown)."""
        state = self.get_state()
        aborted = state.generation.abort_all() if state.generation else 0
        logger.warning("signal %d: exiting without waiting further; aborting %d request(s)",
                       sig, aborted)
        self.should_exit = True

    def start_drain(self, sig: int) -> None:
        if self.drain_task is None:
            self.drain_task = asyncio.create_task(self.drain(sig))

    async def drain(self, sig: int) -> None:
        state = self.get_state()
        state.draining = True
        logger.info("signal %d: draining %d in-flight request(s) for up to %.1fs", sig,
                    state.in_flight, self.shutdown_timeout)
        try:
            await asyncio.wait_for(state.wait_idle(), self.shutdown_timeout)
        except asyncio.TimeoutError:
            aborted = state.generation.abort_all() if state.generation else 0
            logger.warning("shutdown timeout: aborting %d request(s) still running", aborted)
            try:
                await asyncio.wait_for(state.wait_idle(), ABORT_GRACE_S)
            except asyncio.TimeoutError:
                logger.error("%d request(s) did not end after abort", state.in_flight)
        logger.info("drained; shutting down")
        self.should_exit = True
