"""The live view's history and its judgements, without a server: the ring stays the same
size over a day of points, minutes fold their seconds as documented, deltas give what is
new, and each saturation signal tells a steady rise from a sawtooth."""

from __future__ import annotations

import tracemalloc
from typing import Any

from engine.types.stats import EngineStats, StepStats
from server.runtime.saturation import judge_preemptions, judge_queue, judge_stream_speed, judge_ttft
from server.runtime.stats_ring import COARSE_POINTS, FINE_POINTS, SERIES, StatsRing, fold_minute
from server.runtime.stats_sampler import IntervalRecorder, StatsSampler, percentile

DAY_S = 24 * 3600
START = 1_800_000_000  # a whole minute, in unix seconds


def busy_point(t: int, **values: Any) -> dict[str, Any]:
    point: dict[str, Any] = {name: float(t % 7) for name in SERIES}
    point["t"] = t
    return point | values


def feed(ring: StatsRing, start: int, seconds: int) -> None:
    for t in range(start, start + seconds):
        ring.add(busy_point(t))


def test_a_simulated_day_keeps_the_ring_at_its_size_and_memory_flat() -> None:
    """A day of 1-second points, then a second day: both deques are full at their bound, and
    the second day allocates no more than the first left standing (what would grow, a
    list of every point, would hold 86,400 more dicts, megabytes)."""
    ring = StatsRing()
    tracemalloc.start()
    try:
        feed(ring, START, DAY_S)
        after_one_day, _ = tracemalloc.get_traced_memory()
        feed(ring, START + DAY_S, DAY_S)
        after_two_days, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ring.fine) == FINE_POINTS == 600
    assert len(ring.coarse) == COARSE_POINTS == 1440
    assert ring.fine_seq == 2 * DAY_S
    # The coarse ring covers the last 24 hours: its first minute is a day before its last.
    assert ring.coarse[-1]["t"] - ring.coarse[0]["t"] == DAY_S - 60
    assert ring.fine[-1]["t"] - ring.fine[0]["t"] == FINE_POINTS - 1
    assert after_two_days - after_one_day < 64 * 1024, (after_one_day, after_two_days)


def test_a_minute_folds_its_seconds_median_max_mean_and_sum() -> None:
    seconds = [busy_point(START + i, ttft_p50=float(i), ttft_p99=float(i), waiting=float(i),
                          preemptions=1, itl_p50=None) for i in range(60)]
    folded = fold_minute(START, seconds)
    assert folded["t"] == START
    assert folded["ttft_p50"] == 29.5  # median
    assert folded["ttft_p99"] == 59.0  # max
    assert folded["waiting"] == 29.5  # mean
    assert folded["preemptions"] == 60  # sum
    assert folded["itl_p50"] is None  # no token in the minute


def test_a_minute_is_closed_by_the_first_point_of_the_next() -> None:
    ring = StatsRing()
    feed(ring, START, 60)
    assert len(ring.coarse) == 0
    ring.add(busy_point(START + 60))
    assert [p["t"] for p in ring.coarse] == [START]


def test_since_gives_what_was_added_after_a_sequence_number() -> None:
    ring = StatsRing()
    feed(ring, START, 90)
    fine_seq, coarse_seq = ring.fine_seq, ring.coarse_seq
    feed(ring, START + 90, 40)
    fine, coarse = ring.since(fine_seq, coarse_seq)
    assert [p["t"] for p in fine] == list(range(START + 90, START + 130))
    assert [p["t"] for p in coarse] == [START + 60]
    assert ring.since(ring.fine_seq, ring.coarse_seq) == ([], [])


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([0.3], 0.99) == 0.3
    assert percentile([], 0.5) is None


def test_the_sampler_turns_counters_into_rates_and_latencies_into_percentiles() -> None:
    stats = EngineStats()
    sampler = StatsSampler(lambda: stats, lambda: 3)
    stats = EngineStats(num_running=4, num_waiting=2, kv_cache_usage=0.5,
                        num_preemptions_total=1, generation_tokens_total=100,
                        prefix_cache_queries_total=200, prefix_cache_hits_total=50)
    for ttft in (0.1, 0.2, 0.3):
        sampler.recorder.observe_ttft(ttft)
    sampler.recorder.observe_itl(0.02, 10)
    sampler.recorder.observe_step(StepStats(num_tokens=4, num_prompt_tokens=0,
                                            num_generation_tokens=4, num_preemptions=0,
                                            num_running=4, num_waiting=2, kv_cache_usage=0.5,
                                            step_time=0.01, num_decodes=4))
    sampler.last_time -= 2.0  # two seconds since the last point: rates halve the counts
    point = sampler.sample()
    assert point["running"] == 4 and point["waiting"] == 2 and point["queued"] == 3
    assert point["preemptions"] == 1 and point["prefix_hit_rate"] == 0.25
    assert 45 < point["out_tok_s"] <= 50
    assert point["ttft_p50"] == 0.2 and point["ttft_p99"] == 0.3
    assert point["itl_p50"] == 0.02 and point["decode_batch"] == 4.0 and point["requests"] == 3
    # The next interval starts empty.
    again = sampler.sample()
    assert again["ttft_p50"] is None and again["out_tok_s"] == 0 and again["requests"] == 0
    assert sampler.ring.fine_seq == 2


def test_the_recorder_bounds_what_one_interval_keeps() -> None:
    recorder = IntervalRecorder()
    recorder.observe_itl(0.01, 10**7)
    assert len(recorder.itls) == 100_000


def points(series: dict[str, list[Any]], step: int = 1) -> list[dict[str, Any]]:
    length = len(next(iter(series.values())))
    return [{"t": START + i * step, **{name: values[i] for name, values in series.items()}}
            for i in range(length)]


def test_ttft_rising_steadily_is_capacity_and_level_is_not() -> None:
    rising = points({"ttft_p50": [0.2 + 0.1 * i for i in range(30)]}, step=60)
    verdict = judge_ttft([], rising)
    assert verdict["state"] == "capacity"
    assert "rising for 29 min" in verdict["text"]
    level = points({"ttft_p50": [2.0 + 0.1 * (i % 2) for i in range(30)]}, step=60)
    assert judge_ttft([], level)["state"] == "busy"
    assert judge_ttft(points({"ttft_p50": [0.05] * 10}), [])["state"] == "ok"
    assert judge_ttft(points({"ttft_p50": [None] * 10}), [])["state"] == "idle"


def test_a_queue_sawtooth_is_absorbed_and_a_queue_that_never_empties_is_capacity() -> None:
    sawtooth = points({"waiting": [3 if i % 30 < 5 else 0 for i in range(300)]})
    assert judge_queue(sawtooth)["state"] == "absorbed"
    stuck = points({"waiting": [0] * 100 + [5] * 120})
    verdict = judge_queue(stuck)
    assert verdict["state"] == "capacity" and "120 s" in verdict["text"]
    assert judge_queue(points({"waiting": [0] * 100 + [5] * 10}))["state"] == "burst"
    assert judge_queue(points({"waiting": [0] * 100}))["state"] == "empty"


def test_stream_speed_sags_only_when_batches_grew() -> None:
    filling = points({"itl_p50": [0.01] * 10 + [0.05] * 10, "decode_batch": [1] * 10 + [32] * 10})
    assert judge_stream_speed(filling)["state"] == "sagging"
    # Slower with no larger batch: not the batch filling (another cause), so not "sagging".
    slower = points({"itl_p50": [0.01] * 10 + [0.05] * 10, "decode_batch": [8] * 20})
    assert judge_stream_speed(slower)["state"] == "ok"


def test_preemptions_are_capacity_now_and_remembered_for_the_day() -> None:
    assert judge_preemptions(points({"preemptions": [0] * 9 + [2]}), [])["state"] == "capacity"
    earlier = points({"preemptions": [4, 0, 0]}, step=60)
    verdict = judge_preemptions(points({"preemptions": [0] * 10}), earlier)
    assert verdict["state"] == "past" and "4 today" in verdict["text"]
    assert judge_preemptions(points({"preemptions": [0] * 10}), [])["state"] == "ok"
