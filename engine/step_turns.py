"""Engines in one process take turns: one engine step at a time, in the order they asked.

Several models served by one process (server/runtime/model_registry.py) each have an engine
with its own step thread. Each step already spreads over all of torch's threads, so two steps
at once would only split the cores between them and evict each other's weights from the
caches; taking turns keeps each step as fast as when its model is served alone. The turns are
first come, first served: a plain lock lets the thread that just released it take it again
at once, and one busy model would starve the others. With one engine the lock is always free.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator


class FairTurns:
    """A lock granted in the order it was asked for."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._waiting: collections.deque[threading.Event] = collections.deque()
        self._held = False

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._release()

    def _acquire(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            mine = threading.Event()
            self._waiting.append(mine)
        mine.wait()  # handed over by _release: _held stays True

    def _release(self) -> None:
        with self._guard:
            if self._waiting:
                self._waiting.popleft().set()
            else:
                self._held = False


STEPS = FairTurns()  # every engine of the process steps under it
