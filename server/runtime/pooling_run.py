"""One admitted pooling request, run: its queue slot held until the engine answers, counted
in flight (so the shutdown drain waits for it) and in the request metrics as a request of
prompt tokens only."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from server.runtime.admitted import Admitted
from server.runtime.generation import format_seconds, request_logger

T = TypeVar("T")


async def run_admitted(admitted: Admitted, request_id: str, num_inputs: int, num_tokens: int,
                       work: Callable[[], Awaitable[T]]) -> T:
    """await work() inside the request's queue slot and the in-flight count; on success, the
    finished request goes to the metrics and the request log, as a generation request does."""
    slot = admitted.queue.take_slots(1)[0]
    service = admitted.generation
    service.in_flight += 1
    service.idle.clear()
    start = time.monotonic()
    try:
        result = await work()
    finally:
        slot.release()
        service.end_request()
    elapsed = time.monotonic() - start
    service.metrics.observe_finished("stop", num_tokens, 0, None, None, elapsed)
    request_logger.info("request finished id=%s inputs=%d prompt_tokens=%d e2e=%s finish_reason=stop",
                        request_id, num_inputs, num_tokens, format_seconds(elapsed))
    return result
