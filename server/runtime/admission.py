"""The bounded queue: past --max-num-queued-reqs waiting requests, answer 429 at once.

A sub-request counts as queued from its admission until the engine hands back its first
delta (it is then running) or it ends. The count lives in the server, where checking and
taking a slot happen without an await between them, so concurrent arrivals cannot all
slip past the bound the way they could by reading the engine's waiting count.
"""

from __future__ import annotations

from collections.abc import Callable

from server.api.errors import APIError


class QueueSlot:
    """One sub-request's place in the queue; release() is idempotent."""

    def __init__(self, on_release: Callable[[], None]) -> None:
        self._on_release: Callable[[], None] | None = on_release

    def release(self) -> None:
        if self._on_release is not None:
            self._on_release()
            self._on_release = None


QUEUE_TOKENS_PER_REQUEST = 128  # the default bound: the KV capacity in requests of this size
MIN_QUEUE_BOUND = 8


def default_queue_bound(kv_tokens: int) -> int:
    """Without --max-num-queued-reqs, queue about as many requests as the KV cache could
    admit at 128 tokens each: a deeper queue only adds waiting time and memory, a shallower
    one refuses work the cache could take."""
    return max(MIN_QUEUE_BOUND, kv_tokens // QUEUE_TOKENS_PER_REQUEST)


class Admission:
    def __init__(self, max_queued: int | None, retry_after_s: int = 1,
                 on_refuse: Callable[[], None] = lambda: None) -> None:
        self.max_queued = max_queued
        self.retry_after_s = retry_after_s
        self.on_refuse = on_refuse  # counts the refusal (pagode:request_rejected_total)
        self.queued = 0

    def refuse_if_full(self, count: int) -> None:
        """The 429, carrying Retry-After, when `count` more would not fit."""
        if self.is_full(count):
            self.on_refuse()
            raise APIError(
                429,
                f"The server is overloaded: {self.queued} requests are already waiting "
                f"(--max-num-queued-reqs {self.max_queued}). Retry later.",
                headers={"Retry-After": str(self.retry_after_s)},
            )

    def take_slots(self, count: int) -> list[QueueSlot]:
        """Take `count` slots, or raise the 429 (no await between the check and the take)."""
        self.refuse_if_full(count)
        self.queued += count
        return [QueueSlot(self._release_one) for _ in range(count)]

    def is_full(self, count: int) -> bool:
        if self.max_queued is None:
            return False
        if count > self.max_queued:
            # A request wider than the whole bound is let in only when nothing waits,
            # so that it is delayed rather than refused forever.
            return self.queued > 0
        return self.queued + count > self.max_queued

    def _release_one(self) -> None:
        self.queued -= 1
