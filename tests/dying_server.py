"""A fault-injection double of the engine: its loop dies, as an internal fault would kill
it, when the process gets SIGUSR1. tests/test_server_ops.py serves it through the plugin
point a user has too, `pagode serve --engine-factory tests.dying_server:DyingEngine`, to see
how the server behaves with a dead engine; production has no such hook."""

from __future__ import annotations

import asyncio
import signal

from engine.async_engine import AsyncEngine

DYING_MESSAGE = "the engine loop was killed (tests/dying_server.py)"


class DyingEngine(AsyncEngine):
    """An AsyncEngine whose next step raises once SIGUSR1 has arrived."""

    dying = False

    async def start(self) -> None:
        await super().start()
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.kill)

    def kill(self) -> None:
        self.dying = True
        self._wakeup.set()

    def _has_work(self) -> bool:
        return self.dying or super()._has_work()

    def _step(self):  # type: ignore[no-untyped-def]
        if self.dying:
            raise RuntimeError(DYING_MESSAGE)
        return super()._step()
