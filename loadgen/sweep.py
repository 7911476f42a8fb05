"""`--sweep`: the highest offered rate whose requests meet an SLO, by bisection.

Like guidellm's sweep, it reports a capacity: the rate a server sustains while at least
`attainment` of its requests meet every objective (TTFT, per-request ITL i.e. TPOT, E2E;
loadgen's goodput rule). The same seeded trace is replayed at each probed rate. The rate
doubles (or halves) from the first --rate until the answer changes, then the bracket is
halved until it is within `rel_tol`, or `max_runs` runs have been spent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Probe:
    rate: float
    attainment: float
    meets: bool


@dataclass
class SweepResult:
    capacity: float | None  # the highest rate seen to meet the SLO; None if none did
    upper: float | None  # the lowest rate seen to miss it
    probes: list[Probe] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"capacity_rate": self.capacity, "first_failing_rate": self.upper,
                "probes": [p.__dict__ for p in self.probes]}


async def bisect_capacity(
    attain: Callable[[float], Awaitable[float]], start: float, target: float = 0.99,
    rel_tol: float = 0.1, max_runs: int = 8,
) -> SweepResult:
    """attain(rate) -> the fraction of requests meeting the SLO at that rate (one real run)."""
    result = SweepResult(None, None)

    async def meets(rate: float) -> bool:
        share = await attain(rate)
        ok = share >= target
        result.probes.append(Probe(rate, share, ok))
        if ok:
            result.capacity = max(result.capacity or 0.0, rate)
        else:
            result.upper = rate if result.upper is None else min(result.upper, rate)
        return ok

    rate = start
    up = await meets(rate)
    while len(result.probes) < max_runs and (result.capacity is None or result.upper is None):
        rate = rate * 2 if up else rate / 2
        up = await meets(rate)
    while (len(result.probes) < max_runs and result.capacity is not None and result.upper is not None
           and result.upper - result.capacity > rel_tol * result.capacity):
        await meets((result.capacity + result.upper) / 2)
    return result
