"""The sweep's bisection, vLLM's result keys and configurable percentiles."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from loadgen.metrics import parse_percentiles, summarize
from loadgen.records import RequestRecord
from loadgen.sweep import bisect_capacity


def run_bisect(capacity: float, start: float, **kw: float) -> tuple[float | None, list[float]]:
    probed: list[float] = []

    async def attain(rate: float) -> float:
        probed.append(rate)
        return 1.0 if rate <= capacity else 0.5

    res = asyncio.run(bisect_capacity(attain, start, **kw))  # type: ignore[arg-type]
    assert [p.rate for p in res.probes] == probed
    return res.capacity, probed


@pytest.mark.parametrize("capacity,start", [(3.3, 1.0), (0.21, 1.0), (1.0, 1.0), (7.9, 8.0)])
def test_bisection_brackets_then_narrows(capacity: float, start: float) -> None:
    found, probed = run_bisect(capacity, start, rel_tol=0.05, max_runs=20)
    assert found is not None and capacity / 1.05 <= found <= capacity
    assert len(probed) <= 12


def test_bisection_stops_at_max_runs_and_reports_what_it_saw() -> None:
    found, probed = run_bisect(3.3, 1.0, rel_tol=0.001, max_runs=4)
    assert len(probed) == 4
    assert found is not None and found <= 3.3


def test_bisection_with_no_passing_rate() -> None:
    found, probed = run_bisect(0.0, 1.0, max_runs=5)
    assert found is None and len(probed) == 5


def record(i: int, ttft: float, gaps: list[float]) -> RequestRecord:
    times = list(np.cumsum([ttft, *gaps]))
    r = RequestRecord(index=i, prompt_len=10, max_tokens=len(times), arrival=0.0, start=0.0,
                      content_times=times, last_event_time=times[-1], output_tokens=len(times),
                      prompt_tokens=10, usage_reported=True, success=True)
    return r


def test_summary_carries_vllm_keys_and_chosen_percentiles() -> None:
    recs = [record(0, 0.1, [0.01, 0.03]), record(1, 0.3, [0.02, 0.02, 0.02])]
    s = summarize(recs, duration=2.0, percentiles=(50, 99.9))
    v = s["vllm"]
    assert v["request_throughput"] == 1.0 and v["output_throughput"] == 3.5
    assert v["completed"] == 2 and v["duration"] == 2.0
    assert v["mean_ttft_ms"] == pytest.approx(200.0)
    assert v["median_ttft_ms"] == pytest.approx(200.0)
    assert v["std_ttft_ms"] == pytest.approx(100.0)
    assert v["p99.9_itl_ms"] == pytest.approx(np.percentile([10, 30, 20, 20, 20], 99.9))
    assert v["p50_e2el_ms"] == pytest.approx(np.median([140, 360]))
    assert "p99_ttft_ms" not in v and "p99.9" in str(list(s["ttft_s"]))
    tpots = [(0.04) / 2, (0.06) / 3]
    assert v["mean_tpot_ms"] == pytest.approx(1e3 * np.mean(tpots))
    assert parse_percentiles("50, 99.9") == (50.0, 99.9)
    with pytest.raises(ValueError):
        parse_percentiles("0,101")
