"""Predictions for a workload: throughput, latency percentiles, the SLO, capacity, advice.

The SLO is loadgen's: ttft and itl in ms, e2e in s; `itl` bounds each request's mean
gap between tokens (its TPOT), as vLLM's goodput does. A rate meets the SLO when at
least `attainment` of its requests meet every objective. The highest such rate is found
by bisection over simulated runs of the same seeded trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.simulator import SimConfig, SimRequest, SimResult, Simulator
from planner.step_model import StepTimeModel
from planner.workload import Workload


@dataclass(frozen=True)
class SLO:
    ttft: float | None = None  # seconds
    itl: float | None = None  # seconds (per-request mean gap, i.e. TPOT)
    e2e: float | None = None  # seconds

    def met_by(self, r: SimRequest) -> bool:
        if self.ttft is not None and r.ttft > self.ttft:
            return False
        if self.e2e is not None and r.e2e > self.e2e:
            return False
        tpot = r.tpot
        return self.itl is None or tpot is None or tpot <= self.itl

    def to_json(self) -> dict[str, float | None]:
        return {"ttft_s": self.ttft, "itl_s": self.itl, "e2e_s": self.e2e}


def parse_slo(text: str) -> SLO:
    """'ttft=2000,itl=200,e2e=60': ttft and itl in ms, e2e in s (loadgen's syntax)."""
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().lower().replace("tpot", "itl")
        if not sep or key not in {"ttft", "itl", "e2e"} or float(raw) <= 0:
            raise ValueError(f"bad SLO {part!r}: use ttft=MS,itl=MS,e2e=S with positive values")
        values[key] = float(raw)
    if not values:
        raise ValueError("empty SLO")
    ms = 1e-3
    return SLO(values["ttft"] * ms if "ttft" in values else None,
               values["itl"] * ms if "itl" in values else None, values.get("e2e"))


def pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(result: SimResult, percentiles: Sequence[float] = (50, 99)) -> dict[str, Any]:
    reqs = result.requests
    dists = {"ttft_s": [r.ttft for r in reqs], "itl_s": [g for r in reqs for g in r.itls],
             "tpot_s": [t for r in reqs if (t := r.tpot) is not None], "e2e_s": [r.e2e for r in reqs]}
    out: dict[str, Any] = {
        "completed": len(reqs), "unservable": result.unservable,
        "duration_s": result.duration,
        "request_throughput": len(reqs) / result.duration if result.duration > 0 else None,
        "output_throughput": result.output_tokens / result.duration if result.duration > 0 else None,
        "steps": result.steps, "preemptions": result.preemptions,
        "max_running": result.max_running, "max_kv_usage": result.max_kv_usage,
    }
    for name, values in dists.items():
        out[name] = {"mean": float(np.mean(values)) if values else None,
                     **{f"p{q:g}": pct(values, q) for q in percentiles}}
    return out


def attainment(result: SimResult, slo: SLO) -> float:
    total = len(result.requests) + result.unservable
    return sum(slo.met_by(r) for r in result.requests) / total if total else 0.0


def simulate(config: SimConfig, model: StepTimeModel, workload: Workload, rate: float) -> SimResult:
    return Simulator(config, model, seed=workload.seed).run(workload.requests(rate))


def bisect_rate(meets: Callable[[float], bool], start: float = 0.5, rel_tol: float = 0.05,
                max_rate: float = 1e4) -> float | None:
    """The highest rate r with meets(r), assuming meets is monotone (true then false).

    Doubles (or halves) from `start` to bracket the change, then bisects until the
    bracket is within rel_tol. None when even start / 2**10 fails."""
    lo: float | None = None
    hi: float | None = None
    r = start
    if meets(r):
        lo = r
        while hi is None:
            r *= 2
            if r > max_rate:
                return lo
            if meets(r):
                lo = r
            else:
                hi = r
    else:
        hi = r
        for _ in range(10):
            r /= 2
            if meets(r):
                lo = r
                break
            hi = r
        if lo is None:
            return None
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def capacity(config: SimConfig, model: StepTimeModel, workload: Workload, slo: SLO,
             target: float = 0.99, start: float = 0.5) -> float | None:
    """The highest Poisson rate at which `target` of the requests meet the SLO."""
    return bisect_rate(lambda r: attainment(simulate(config, model, workload, r), slo) >= target, start)


def advise(result: SimResult, summary: dict[str, Any], config: SimConfig, slo: SLO | None) -> dict[str, str]:
    """docs/deploy.md's rule ("When to scale out, and when to scale up") on the simulated signals.

    Scale up (more KV memory) when KV usage sits near 1 and preemptions climb (or the
    batch is held below max_num_seqs by the cache) while ITL is still low; scale out
    (more replicas) when the batch is as large as compute allows: ITL rises and the
    queue and TTFT grow."""
    kv_bound = result.max_kv_usage >= 0.9 - config.watermark / 2 or result.preemptions > 0
    batch_room = result.max_running < config.max_num_seqs
    tpot_p99 = summary["tpot_s"].get("p99")
    itl_ok = slo is None or slo.itl is None or (tpot_p99 is not None and tpot_p99 <= slo.itl)
    if kv_bound and batch_room and itl_ok:
        return {"next_step": "more KV memory",
                "why": f"KV usage peaks at {result.max_kv_usage:.0%} with {result.preemptions} "
                       f"preemptions while per-token latency still meets its objective: the cache, "
                       f"not compute, holds the batch at {result.max_running} sequences"}
    return {"next_step": "more replicas",
            "why": f"the batch reaches {result.max_running} sequences with KV usage at "
                   f"{result.max_kv_usage:.0%}: compute, not the cache, is the limit, so per-token "
                   f"latency grows with the batch and only another replica adds throughput"}
