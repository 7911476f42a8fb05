"""Floods and slow clients, on a small server of its own (its KV cache holds about 11
requests of 128 tokens, so the default queue bound is small).

- Flood: open-loop arrivals at 10x the server's measured capacity for PAGODE_FLOOD_SECONDS
  (20) from a bounded client (at most 64 requests in flight). The 429s answer about as fast
  as the 400s mixed into the same flood, the server's RSS stays within 10% of its level after
  warm-up, every accepted request completes, and nothing leaks afterwards (running =
  waiting = queued = 0, KV usage 0).
- Slow clients: connections that send half a request head, or a head and half a body, are
  closed after --header-timeout / --body-timeout.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from server_fixtures import ServerProcess, metric_value, running_server

pytestmark = pytest.mark.slow

# Twenty seconds at 10x capacity is a few hundred arrivals: hundreds of 429s for their p99,
# dozens of 400s for the baseline, and a queue held full for many times its drain time.
FLOOD_SECONDS = float(os.environ.get("PAGODE_FLOOD_SECONDS", "20"))
OVERLOAD = 10.0
MAX_IN_FLIGHT = 64
WARM_UP = 8  # requests at once: the batch (4) and part of the queue (11)
TIMEOUTS = ["--header-timeout", "2", "--body-timeout", "2", "--sse-send-timeout", "2"]
FLOOD_ARGS = ["--kv-cache-memory", "64MiB", "--kv-cache-dtype", "fp32", "--max-model-len", "256", "--max-num-seqs", "4",
              "--disable-access-log", *TIMEOUTS]
BODY = {"prompt": "Write one sentence about the sea.", "max_tokens": 8, "ignore_eos": True,
        "temperature": 0}
# What the 429 bound must catch is a refusal that waits for work (tokenizing, the engine):
# under a sustained flood the queue never drains, so such a refusal waits a generation or
# more, seconds to tens of seconds. What a refusal does cost, the client, the event loop and
# the engine's compute threads sharing two cores, is load that moves with the machine (a 429
# p99 of 40 ms on a quiet machine, 994 ms on a shared one), so the bound is relative to a
# baseline taken in the same flood: a 400 for an invalid body, which does the same HTTP and
# JSON work and stops before any work is queued. The 400s are drawn from the flood's own
# arrivals, so they meet the same bursts and the same queue at the event loop as the 429s;
# a probe sent one at a time beside the flood never queues behind a burst, and its p99
# missed the stalls the 429s wait through.
P99_429_FACTOR = float(os.environ.get("PAGODE_FLOOD_P99_FACTOR", "3"))
P99_429_SLACK_S = 0.05  # the refusal's own admission step, and a floor on a quiet machine
INVALID_SHARE = 0.1  # of the flood's arrivals
INVALID_BODY = {**BODY, "max_tokens": 0}  # 400 at validation: max_tokens 0 needs echo


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log_dir = tmp_path_factory.mktemp("flood-logs")
    with running_server(FLOOD_ARGS, log_dir, name="flood") as proc:
        yield proc


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class FloodResult:
    statuses: dict[int, int] = field(default_factory=dict)
    latencies_429: list[float] = field(default_factory=list)
    latencies_400: list[float] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    client_skipped: int = 0
    retry_after: set[str] = field(default_factory=set)


async def one(client: httpx.AsyncClient, result: FloodResult, invalid: bool = False) -> None:
    started = time.monotonic()
    response = await client.post("/v1/completions", json=INVALID_BODY if invalid else BODY)
    elapsed = time.monotonic() - started
    if invalid:
        result.latencies_400.append(elapsed)
        if response.status_code != 400:
            result.incomplete.append(f"invalid body got {response.status_code}: "
                                     f"{response.text[:200]}")
        return
    result.statuses[response.status_code] = result.statuses.get(response.status_code, 0) + 1
    if response.status_code == 429:
        result.latencies_429.append(elapsed)
        result.retry_after.add(response.headers.get("retry-after", ""))
    elif response.status_code == 200:
        choice = response.json()["choices"][0]
        if choice["finish_reason"] != "length" or not choice["text"]:
            result.incomplete.append(response.text[:200])
    else:
        result.incomplete.append(f"{response.status_code}: {response.text[:200]}")


async def measure_capacity(client: httpx.AsyncClient) -> float:
    """Completed requests per second with the batch full (the warm-up, too)."""
    result = FloodResult()
    started = time.monotonic()
    await asyncio.gather(*(one(client, result) for _ in range(WARM_UP)))
    assert result.statuses == {200: WARM_UP}, result
    return WARM_UP / (time.monotonic() - started)


async def flood(client: httpx.AsyncClient, rate: float, seconds: float) -> FloodResult:
    result = FloodResult()
    rng = random.Random(0)
    in_flight: set[asyncio.Task[None]] = set()
    deadline = time.monotonic() + seconds
    next_at = time.monotonic()
    while next_at < deadline:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if len(in_flight) >= MAX_IN_FLIGHT:
            result.client_skipped += 1  # the bounded client does not pile up more
        else:
            task = asyncio.create_task(one(client, result, rng.random() < INVALID_SHARE))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        next_at += rng.expovariate(rate)
    await asyncio.gather(*in_flight)
    return result


async def wait_idle(client: httpx.AsyncClient, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = (await client.get("/metrics")).text
        values = [metric_value(text, f"pagode:{name}") for name in
                  ("num_requests_running", "num_requests_waiting", "num_requests_queued",
                   "kv_cache_usage_perc")]
        if values == [0, 0, 0, 0] or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def test_flood_at_ten_times_capacity(small: ServerProcess) -> None:
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT)
    async with httpx.AsyncClient(base_url=small.base_url, timeout=120.0, limits=limits) as client:
        capacity = await measure_capacity(client)
        await measure_capacity(client)  # a second warm-up: allocator and caches settle
        rss_warm = rss_bytes(small.proc.pid)
        result = await flood(client, OVERLOAD * capacity, FLOOD_SECONDS)
        text = await wait_idle(client)
        rss_after = rss_bytes(small.proc.pid)
    p99 = percentile(result.latencies_429, 0.99) if result.latencies_429 else 0.0
    latencies_400 = result.latencies_400
    p99_400 = percentile(latencies_400, 0.99)
    limit = P99_429_FACTOR * p99_400 + P99_429_SLACK_S
    summary = (f"capacity {capacity:.2f} req/s, offered {OVERLOAD * capacity:.1f} req/s for "
               f"{FLOOD_SECONDS:.0f}s: statuses {result.statuses}, client-skipped "
               f"{result.client_skipped}, 429 p50 "
               f"{percentile(result.latencies_429, 0.5) * 1000 if result.latencies_429 else 0:.1f}"
               f" ms p99 {p99 * 1000:.1f} ms (limit {limit * 1000:.0f} ms: {P99_429_FACTOR:g} x "
               f"the p99 {p99_400 * 1000:.1f} ms of {len(latencies_400)} 400s under the flood "
               f"+ {P99_429_SLACK_S * 1000:.0f} ms), RSS {rss_warm / 2**20:.0f} -> "
               f"{rss_after / 2**20:.0f} MiB")
    print(summary)
    (Path(small.log_path).parent / "flood-summary.txt").write_text(summary + "\n")
    assert set(result.statuses) <= {200, 429}, summary
    assert result.statuses.get(429, 0) > 0 and result.statuses.get(200, 0) > 0, summary
    assert result.retry_after == {"1"}, summary
    assert not result.incomplete, result.incomplete[:3]
    assert len(latencies_400) >= 10, summary
    assert p99 < limit, summary
    assert abs(rss_after - rss_warm) <= 0.10 * rss_warm, summary
    for name in ("num_requests_running", "num_requests_waiting", "num_requests_queued",
                 "kv_cache_usage_perc"):
        assert metric_value(text, f"pagode:{name}") == 0, name
    assert "queue bound 11" in small.log(), "the default bound is derived from the KV cache"


def open_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed (an optional 408 body, then EOF)."""
    sock.settimeout(0.05)
    try:
        while chunk := sock.recv(65536):
            if not chunk:
                break
        return True
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


async def test_slow_clients_are_cut(small: ServerProcess) -> None:
    half_heads = [open_socket(small.port) for _ in range(20)]
    for sock in half_heads:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
    half_bodies = [open_socket(small.port) for _ in range(20)]
    for sock in half_bodies:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
    try:
        deadline = time.monotonic() + 10.0
        open_ones = half_heads + half_bodies
        while open_ones and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            open_ones = [s for s in open_ones if not closed_by_server(s)]
        assert not open_ones, f"{len(open_ones)} slow connections still open after 10 s"
        async with httpx.AsyncClient(base_url=small.base_url) as client:
            assert (await client.get("/health")).status_code == 200
    finally:
        for sock in half_heads + half_bodies:
            sock.close()
