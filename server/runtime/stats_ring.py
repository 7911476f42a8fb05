"""The live view's history: 1-second points for the last 10 minutes and 1-minute points for
the last 24 hours, each in a fixed-size deque, so a server up for a month holds what one up
for a day holds (no database, memory flat).

A point is a dict of plain numbers (JSON as it stands). Each 1-second point is also folded
into the minute it falls in; a minute is closed, and appended to the coarse deque, when the
first point of a later minute arrives.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from typing import Any

FINE_INTERVAL_S = 1.0
FINE_POINTS = 600  # 10 minutes
COARSE_INTERVAL_S = 60.0
COARSE_POINTS = 1440  # 24 hours

# The series of a point, and how the points of a minute fold into one: a latency
# percentile's median (p50s) or maximum (p99s: a conservative bound, since percentiles of
# seconds do not add up to the minute's), a gauge's mean, a count's sum.
FOLD: dict[str, str] = {
    "ttft_p50": "median", "ttft_p99": "max",
    "itl_p50": "median", "itl_p99": "max",
    "running": "mean", "waiting": "mean", "queued": "mean",
    "kv_usage": "mean", "decode_batch": "mean", "prefix_hit_rate": "mean",
    "out_tok_s": "mean", "preemptions": "sum", "requests": "sum",
}
SERIES = tuple(FOLD)

Point = dict[str, Any]


def fold_minute(minute: float, points: list[Point]) -> Point:
    """One coarse point from the fine points of one minute; a series no point has (a
    latency in a minute without requests) stays None."""
    folded: Point = {"t": minute}
    for name, how in FOLD.items():
        values = [p[name] for p in points if p.get(name) is not None]
        if not values:
            folded[name] = None
        elif how == "median":
            folded[name] = statistics.median(values)
        elif how == "max":
            folded[name] = max(values)
        elif how == "sum":
            folded[name] = sum(values)
        else:
            folded[name] = sum(values) / len(values)
    return folded


class StatsRing:
    """Both resolutions, and a sequence number per point so a stream can send what is new."""

    def __init__(self, fine_points: int = FINE_POINTS, coarse_points: int = COARSE_POINTS,
                 coarse_interval_s: float = COARSE_INTERVAL_S) -> None:
        self.fine: deque[Point] = deque(maxlen=fine_points)
        self.coarse: deque[Point] = deque(maxlen=coarse_points)
        self.coarse_interval_s = coarse_interval_s
        self.open_minute: float | None = None
        self.open_points: list[Point] = []
        self.fine_seq = 0  # points ever added, at each resolution
        self.coarse_seq = 0

    def add(self, point: Point) -> None:
        """Append a 1-second point (its `t`: unix seconds) and close the minute before it."""
        minute = point["t"] - point["t"] % self.coarse_interval_s
        if self.open_minute is not None and minute != self.open_minute:
            self.coarse.append(fold_minute(self.open_minute, self.open_points))
            self.coarse_seq += 1
            self.open_points = []
        self.open_minute = minute
        self.open_points.append(point)
        self.fine.append(point)
        self.fine_seq += 1

    def since(self, fine_seq: int, coarse_seq: int) -> tuple[list[Point], list[Point]]:
        """The points added after the given sequence numbers (at most what the deques hold)."""
        return (tail(self.fine, self.fine_seq - fine_seq),
                tail(self.coarse, self.coarse_seq - coarse_seq))


def tail(points: deque[Point], count: int) -> list[Point]:
    count = max(0, min(count, len(points)))
    return list(points)[len(points) - count:] if count else []


def values(points: Iterable[Point], name: str) -> list[float]:
    """A series' values, the points without one left out."""
    return [p[name] for p in points if p.get(name) is not None]
