"""Once a second, one point of the live view: the engine's gauges and the change of its
counters since the last point, with the latencies the server saw in between (TTFT of the
requests that finished, ITL of every token sent) turned into p50 and p99. The point goes
into the StatsRing, and every stats stream waiting for it wakes up.

Latencies are kept raw for one interval only (and at most MAX_LATENCIES of each), so the
percentiles are exact and the memory is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.types.stats import EngineStats, StepStats
from server.runtime.stats_ring import FINE_INTERVAL_S, Point, StatsRing

logger = logging.getLogger("pagode.server")

MAX_LATENCIES = 100_000  # per interval; past it later values are dropped


def percentile(sorted_values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile; None without values."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[rank]


class IntervalRecorder:
    """What happened between two points; fed from the engine's thread (steps) and the event
    loop (latencies), hence the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.decode_steps = 0
        self.decode_seqs = 0
        self.finished = 0

    def observe_ttft(self, seconds: float) -> None:
        with self.lock:
            self.finished += 1
            if len(self.ttfts) < MAX_LATENCIES:
                self.ttfts.append(seconds)

    def observe_itl(self, seconds: float, num_tokens: int) -> None:
        with self.lock:
            room = MAX_LATENCIES - len(self.itls)
            self.itls.extend([seconds] * max(0, min(num_tokens, room)))

    def observe_step(self, step: StepStats) -> None:
        if step.num_decodes > 0:
            with self.lock:
                self.decode_steps += 1
                self.decode_seqs += step.num_decodes

    def drain(self) -> dict[str, Any]:
        """The interval's latency percentiles and mean decode batch; starts a new interval."""
        with self.lock:
            ttfts, itls = sorted(self.ttfts), sorted(self.itls)
            steps, seqs, finished = self.decode_steps, self.decode_seqs, self.finished
            self.reset()
        return {"ttft_p50": percentile(ttfts, 0.5), "ttft_p99": percentile(ttfts, 0.99),
                "itl_p50": percentile(itls, 0.5), "itl_p99": percentile(itls, 0.99),
                "decode_batch": seqs / steps if steps else 0.0, "requests": finished}


def counter_point(now: EngineStats, before: EngineStats, seconds: float) -> Point:
    """The series read from the engine's gauges and from its counters' change."""
    queries = now.prefix_cache_queries_total - before.prefix_cache_queries_total
    hits = now.prefix_cache_hits_total - before.prefix_cache_hits_total
    return {
        "running": now.num_running, "waiting": now.num_waiting, "kv_usage": now.kv_cache_usage,
        "out_tok_s": (now.generation_tokens_total - before.generation_tokens_total) / seconds,
        "preemptions": now.num_preemptions_total - before.num_preemptions_total,
        "prefix_hit_rate": hits / queries if queries > 0 else None,
    }


class StatsSampler:
    """Owns the ring and the task that fills it."""

    def __init__(self, read_stats: Callable[[], EngineStats | None],
                 read_queued: Callable[[], int], ring: StatsRing | None = None,
                 interval_s: float = FINE_INTERVAL_S) -> None:
        self.read_stats = read_stats
        self.read_queued = read_queued
        self.ring = ring or StatsRing()
        self.interval_s = interval_s
        self.recorder = IntervalRecorder()
        self.last_stats = read_stats() or EngineStats()
        self.last_time = time.monotonic()
        self.new_point = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.run(), name="stats-sampler")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def run(self) -> None:
        """Sample on the wall clock's seconds, so points of one minute share it. Each point is
        stamped with the tick it was due at, and the next tick is always a later one: an event
        loop whose timers fire a little early (uvloop's are rounded to the millisecond) would
        otherwise wake just before a tick, then again just after it, and stamp both alike."""
        due = self.next_tick(time.time())
        while True:
            await asyncio.sleep(max(0.0, due - time.time()))
            try:
                self.sample(due)
            except Exception:  # a bad point must not end the live view
                logger.exception("stats sampler: a point was lost")
            due = max(due + self.interval_s, self.next_tick(time.time()) - self.interval_s)

    def next_tick(self, now: float) -> float:
        return (now // self.interval_s + 1) * self.interval_s

    def sample(self, due: float | None = None) -> Point:
        stats = self.read_stats() or EngineStats()
        now = time.monotonic()
        point: Point = {"t": round(time.time() if due is None else due)}
        point |= counter_point(stats, self.last_stats, max(now - self.last_time, 1e-3))
        point |= self.recorder.drain()
        point["queued"] = self.read_queued()
        self.last_stats, self.last_time = stats, now
        self.ring.add(point)
        self.wake_streams()
        return point

    def wake_streams(self) -> None:
        """Every stream waiting on `new_point` wakes; later waiters get a fresh event."""
        self.new_point.set()
        self.new_point = asyncio.Event()
