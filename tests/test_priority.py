"""--scheduling-policy priority: under overload, high-priority requests are served first."""

from __future__ import annotations

from typing import Any

import pytest

from engine import LLM, SamplingParams
from engine.types.outputs import RequestTimes

pytestmark = pytest.mark.slow


def run(llm: LLM, lows: int, highs: int) -> dict[str, RequestTimes]:
    """`lows` requests of priority 1 fill the engine, then `highs` of priority 0 arrive."""
    engine = llm.engine
    params = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    for i in range(lows):
        engine.add_request(f"low-{i}", "Tell me about rivers.", SamplingParams(**params, priority=1))
    engine.step()  # the first lows are running: the engine is full
    for i in range(highs):
        engine.add_request(f"high-{i}", "Tell me about rivers.", SamplingParams(**params))
    times: dict[str, RequestTimes] = {}
    while engine.has_unfinished():
        for delta in engine.step():
            if delta.finished and delta.times is not None:
                times[delta.request_id] = delta.times
    return times


def test_high_priority_gets_lower_ttft(small_llm: LLM, overrides: Any) -> None:
    overrides(max_num_seqs=2)  # overloaded: two run, the rest wait
    times = run(small_llm, lows=6, highs=2)
    first = {rid: t.first_token for rid, t in times.items()}
    waiting_lows = sorted(first[f"low-{i}"] for i in range(2, 6))  # queued when highs arrived
    assert max(first["high-0"], first["high-1"]) < waiting_lows[0]  # type: ignore[operator]
    ttft = {rid: t.ttft for rid, t in times.items()}
    high = sum(ttft[f"high-{i}"] for i in range(2)) / 2  # type: ignore[misc]
    low = sum(ttft[f"low-{i}"] for i in range(2, 6)) / 4  # type: ignore[misc]
    assert high < low


def test_preemption_takes_lowest_priority_first(small_llm: LLM, overrides: Any) -> None:
    # 11 blocks: four sequences growing to ~36 positions (3 blocks each) cannot all stay.
    overrides(watermark=0.0)
    engine = small_llm.engine
    params = {"temperature": 0, "max_tokens": 26, "ignore_eos": True}
    for i, priority in enumerate([0, 5, 1, 2]):
        engine.add_request(f"r{i}-p{priority}", "Tell me a long story about the sea.",
                           SamplingParams(**params, priority=priority))
    preempted: list[str] = []
    engine.step_listeners.append(lambda step: preempted.extend(step.preempted))
    while engine.has_unfinished():
        engine.step()
    engine.step_listeners.clear()
    assert preempted, "the cache was meant to be too small"
    assert preempted[0] == "r1-p5"
