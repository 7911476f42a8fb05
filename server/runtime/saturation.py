"""The four saturation signals, each judged from the ring's series into a state and a
sentence an operator can read: TTFT climbing, the queue staying above zero, per-stream
tokens/s sagging as batches fill, preemptions. A steady rise says capacity; a sawtooth
says bursts that the queue absorbs. docs/ui.md gives the rules in prose.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.runtime.stats_ring import Point, values

TTFT_SLOW_S = 1.0  # users notice a first token past a second
RISE_RATIO = 1.5  # the window's last third over its first third
QUEUE_STUCK_S = 60  # waiting above zero this long without a break: not a burst
SAG_RATIO = 0.5  # per-stream speed below half its best in the window
MIN_POINTS = 5  # fewer points than this with requests: too little to judge a trend


def signal(name: str, state: str, text: str) -> dict[str, str]:
    return {"name": name, "state": state, "text": text}


def judge_all(fine: Sequence[Point], coarse: Sequence[Point]) -> list[dict[str, str]]:
    return [judge_ttft(fine, coarse), judge_queue(fine), judge_stream_speed(fine),
            judge_preemptions(fine, coarse)]


def thirds_ratio(series: Sequence[float]) -> float:
    """Mean of the last third over the mean of the first third."""
    third = max(1, len(series) // 3)
    first = sum(series[:third]) / third
    last = sum(series[-third:]) / third
    return last / first if first > 0 else float("inf")


def rising_since(points: Sequence[Point], name: str) -> float:
    """Seconds from the series' lowest point in the window to its last point."""
    present = [p for p in points if p.get(name) is not None]
    lowest = min(present, key=lambda p: p[name])
    return float(present[-1]["t"] - lowest["t"])


def judge_ttft(fine: Sequence[Point], coarse: Sequence[Point]) -> dict[str, str]:
    """On the last 30 minutes of minute points when there are enough, else the last 10
    minutes of seconds: slow (p50 past a second) and rising (last third 1.5x the first) is
    capacity; slow and level is a heavy load the server keeps up with."""
    minutes = [p for p in coarse if p["t"] >= coarse[-1]["t"] - 30 * 60] if coarse else []
    points: Sequence[Point] = minutes if len(values(minutes, "ttft_p50")) >= MIN_POINTS else fine
    series = values(points, "ttft_p50")
    if not series:
        return signal("ttft", "idle", "TTFT: no requests yet")
    latest = series[-1]
    if latest < TTFT_SLOW_S:
        return signal("ttft", "ok", f"TTFT p50 {latest * 1000:.0f} ms: fine")
    if len(series) >= MIN_POINTS and thirds_ratio(series) >= RISE_RATIO:
        minutes_rising = rising_since(points, "ttft_p50") / 60
        return signal("ttft", "capacity",
                      f"TTFT rising for {minutes_rising:.0f} min, now {latest:.1f} s: capacity")
    return signal("ttft", "busy", f"TTFT {latest:.1f} s, not rising: heavy but steady load")


def judge_queue(fine: Sequence[Point]) -> dict[str, str]:
    """On the last 10 minutes of seconds: never above zero is empty; above zero without a
    break for the last minute is capacity; above zero now and then (a sawtooth) is bursts
    the queue absorbs."""
    series = [p.get("waiting") or 0 for p in fine]
    if not any(series):
        return signal("queue", "empty", "Queue: empty")
    stuck = 0
    for waiting in reversed(series):
        if waiting <= 0:
            break
        stuck += 1
    if stuck >= QUEUE_STUCK_S:
        return signal("queue", "capacity", f"Queue above zero for {stuck} s: capacity")
    if stuck:
        return signal("queue", "burst", f"Queue: {series[-1]:.0f} waiting now, for {stuck} s")
    busy = sum(1 for waiting in series if waiting > 0)
    return signal("queue", "absorbed",
                  f"Queue bursts ({busy} s of the last {len(series)} s): absorbed")


def judge_stream_speed(fine: Sequence[Point]) -> dict[str, str]:
    """Per-stream speed is 1 / ITL p50. Below half its best in the last 10 minutes, with a
    larger decode batch than at the best, is sagging as batches fill."""
    points = [p for p in fine if p.get("itl_p50")]
    if not points:
        return signal("stream_speed", "idle", "Per-stream speed: no tokens yet")
    best = min(points, key=lambda p: p["itl_p50"])
    latest = points[-1]
    speed, best_speed = 1 / latest["itl_p50"], 1 / best["itl_p50"]
    if speed < SAG_RATIO * best_speed and (latest.get("decode_batch") or 0) > (
            best.get("decode_batch") or 0):
        return signal("stream_speed", "sagging",
                      f"Per-stream {speed:.0f} tok/s, {speed / best_speed:.0%} of its best: "
                      f"sagging as batches fill ({latest['decode_batch']:.0f} streams)")
    return signal("stream_speed", "ok", f"Per-stream {speed:.0f} tok/s (best {best_speed:.0f})")


def judge_preemptions(fine: Sequence[Point], coarse: Sequence[Point]) -> dict[str, str]:
    """Any preemption says the KV cache ran out for the running batch."""
    recent = sum(values(fine, "preemptions"))
    day = sum(values(coarse, "preemptions")) + recent
    if recent:
        return signal("preemptions", "capacity",
                      f"{recent:.0f} preemptions in 10 min: KV cache full")
    if day:
        return signal("preemptions", "past", f"No preemption in 10 min ({day:.0f} today)")
    return signal("preemptions", "ok", "No preemptions")

