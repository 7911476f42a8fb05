"""Progress for long jobs: a rich bar on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger("pagode")


def progress(items: Iterable[T], total: int | None, description: str,
             enabled: bool = True) -> Iterator[T]:
    start = time.monotonic()
    if not enabled:
        yield from items
        return
    if sys.stderr.isatty():
        from rich.progress import track
        yield from track(items, total=total, description=description, transient=True)
    else:
        next_report = 0.25
        for i, item in enumerate(items, 1):
            yield item
            if total and i / total >= next_report:
                log.info("%s: %d%% (%d/%d)", description, int(100 * i / total), i, total)
                next_report += 0.25
    log.info("%s: done in %.1f s", description, time.monotonic() - start)
