"""Latency and throughput summaries, with the definitions of `vllm bench serve`.

- TTFT: time to the first SSE event whose choices carry text.
- ITL: gaps between consecutive content events, pooled over all requests.
- TPOT: (e2e - ttft) / (output_tokens - 1) per request, output_tokens from usage.
- E2E: time of the last event minus the start.
Percentiles are numpy's (linear interpolation), as vLLM computes them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from loadgen.records import RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; nan when there is no value."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=float), q))


def pkey(q: float) -> str:
    """50 -> 'p50', 99.9 -> 'p99.9'."""
    return f"p{q:g}"


def describe(values: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> dict[str, float | int | None]:
    """Mean, median, standard deviation and the percentiles of a sample; None where it is empty."""
    if len(values) == 0:
        return {"count": 0, "mean": None, "median": None, "std": None,
                **{pkey(q): None for q in percentiles}}
    stats: dict[str, float | int | None] = {
        "count": len(values), "mean": float(np.mean(values)), "median": float(np.median(values)),
        "std": float(np.std(values))}
    stats.update({pkey(q): percentile(values, q) for q in percentiles})
    return stats


def parse_percentiles(text: str) -> tuple[float, ...]:
    """'50,90,99' -> (50.0, 90.0, 99.0); each in (0, 100]."""
    values = tuple(float(p) for p in text.split(",") if p.strip())
    if not values or any(not 0 < q <= 100 for q in values):
        raise ValueError(f"bad percentiles {text!r}: use e.g. 50,90,99")
    return values


VLLM_METRICS = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s"), ("e2el", "e2e_s"))


def vllm_keys(summary: dict[str, Any], percentiles: Sequence[float]) -> dict[str, Any]:
    """`vllm bench serve --save-result`'s key names (ms), from a summary (s)."""
    out: dict[str, Any] = {k: summary[k] for k in (
        "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput")}
    out["duration"] = summary["duration_s"]
    for short, key in VLLM_METRICS:
        st = summary[key]
        for stat in ("mean", "median", "std"):
            out[f"{stat}_{short}_ms"] = None if st[stat] is None else st[stat] * 1e3
        for q in percentiles:
            v = st[pkey(q)]
            out[f"p{q:g}_{short}_ms"] = None if v is None else v * 1e3
    return out


@dataclass(frozen=True)
class SLO:
    """Service-level objectives a request must all meet to count in goodput."""

    ttft: float | None = None  # seconds
    tpot: float | None = None  # seconds per output token after the first
    e2e: float | None = None  # seconds

    def to_json(self) -> dict[str, float | None]:
        return {"ttft_s": self.ttft, "tpot_s": self.tpot, "e2e_s": self.e2e}


def parse_slo(text: str) -> SLO:
    """'ttft=500,itl=50,e2e=10': TTFT and ITL in ms, E2E in s.

    `itl` bounds the request's mean gap between tokens (its TPOT), the per-request
    quantity vLLM's goodput uses; `tpot` is accepted as a synonym.
    """
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in {"ttft", "itl", "tpot", "e2e"}:
            raise ValueError(f"bad SLO {part!r}: use ttft=MS,itl=MS,e2e=S")
        value = float(raw)
        if value <= 0:
            raise ValueError(f"SLO {key} must be > 0")
        values["tpot" if key == "itl" else key] = value
    if not values:
        raise ValueError("empty SLO")
    ms = 1e-3
    return SLO(
        ttft=values["ttft"] * ms if "ttft" in values else None,
        tpot=values["tpot"] * ms if "tpot" in values else None,
        e2e=values.get("e2e"),
    )


def meets_slo(record: RequestRecord, slo: SLO) -> bool:
    if not record.success:
        return False
    if slo.ttft is not None and (record.ttft is None or record.ttft > slo.ttft):
        return False
    if slo.e2e is not None and (record.e2e is None or record.e2e > slo.e2e):
        return False
    # A request of a single token has no TPOT, so it cannot miss that objective.
    return slo.tpot is None or record.tpot is None or record.tpot <= slo.tpot


def count_errors(records: Iterable[RequestRecord], keep: int = 5) -> list[dict[str, Any]]:
    """The most frequent error messages with their counts, first seen first on ties."""
    counts = Counter(r.error or "unknown error" for r in records if not r.success)
    return [{"message": m, "count": c} for m, c in counts.most_common(keep)]


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an interval ending as another starts does not overlap)."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = current = 0
    for _, step in edges:  # at equal times, -1 sorts before +1
        current += step
        most = max(most, current)
    return most


def streaming_intervals(records: Sequence[RequestRecord]) -> list[tuple[float, float]]:
    """From first token to last event, in run time: when the server was decoding each request."""
    return [
        (r.start + r.ttft, r.start + r.e2e)
        for r in records
        if r.success and r.start is not None and r.ttft is not None and r.e2e is not None
    ]


def summarize(
    records: Sequence[RequestRecord], duration: float, slo: SLO | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, Any]:
    """The report of one run: counts, throughputs and latency distributions.

    The distributions always carry p50 and p99 (the tables and plots use them) beside the
    requested `percentiles`; the vLLM-named keys carry exactly the requested ones."""
    requested = percentiles
    percentiles = tuple(sorted(set(percentiles) | {50.0, 99.0}))
    ok = [r for r in records if r.success]
    input_tokens = sum(r.prompt_tokens if r.prompt_tokens is not None else r.prompt_len for r in ok)
    output_tokens = sum(r.counted_output_tokens for r in ok)
    per_s = 1.0 / duration if duration > 0 else math.nan
    summary: dict[str, Any] = {
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "errors": count_errors(records),
        "usage_missing": sum(1 for r in ok if not r.usage_reported),
        "duration_s": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) * per_s,
        "output_throughput": output_tokens * per_s,
        "total_token_throughput": (input_tokens + output_tokens) * per_s,
        "ttft_s": describe([r.ttft for r in ok if r.ttft is not None], percentiles),
        "tpot_s": describe([r.tpot for r in ok if r.tpot is not None], percentiles),
        "itl_s": describe([gap for r in ok for gap in r.itls], percentiles),
        "e2e_s": describe([r.e2e for r in ok if r.e2e is not None], percentiles),
        "queue_time_s": describe([r.queue_time for r in ok if r.queue_time is not None], percentiles),
        # Client-side view of the batch size: 1 Hz /metrics scrapes can miss the peak.
        "max_concurrent_streaming": max_overlap(streaming_intervals(ok)),
    }
    if slo is not None:
        good = sum(1 for r in records if meets_slo(r, slo))
        summary["slo"] = slo.to_json()
        summary["good_requests"] = good
        summary["goodput"] = good * per_s
    summary["vllm"] = vllm_keys(summary, requested)
    return summary
