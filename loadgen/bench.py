"""One benchmark: prompts fixed by the seed, then one timed replay per offered rate.

A request is sent at its arrival time whether or not earlier ones have finished,
because a service does not choose its requests; only `max_concurrency`, when set,
holds requests back (as in `vllm bench serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from loadgen.arrivals import arrival_times
from loadgen.client import LiveCounters, Target, build_payload, send_request
from loadgen.datasets import PromptSet, sample_prompts
from loadgen.metrics import PERCENTILES, SLO, summarize
from loadgen.records import RequestRecord
from loadgen.scrape import MetricsScraper, Sample
from loadgen.spans import PromptSpec
from loadgen.tokenizer import RemoteTokenizer


@dataclass
class Settings:
    num_prompts: int = 100
    dataset: str = "text"
    input_len: tuple[int, int] = (16, 128)
    output_len: tuple[int, int] = (32, 384)
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    ignore_eos: bool = False
    slo: SLO | None = None
    timeout: float = 3600.0  # seconds without a byte before a request fails
    scrape_interval: float = 1.0
    show_progress: bool = True
    percentiles: tuple[float, ...] = PERCENTILES


@dataclass
class RateResult:
    rate: float
    summary: dict[str, Any]
    server: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    timeline: list[Sample] = field(default_factory=list)
    concurrency: int | None = None  # the cap on requests in flight (a closed loop at rate inf)


def make_http_client(timeout: float, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    """One client for everything (the API key reaches /tokenize and /v1/models too)."""
    # No pool limit: the client must never be what holds requests back.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), limits=limits,
                             headers=headers)


async def discover_model(http: httpx.AsyncClient, base_url: str) -> str | None:
    """The first model of GET /v1/models, or None when the server does not list one."""
    try:
        resp = await http.get(base_url.rstrip("/") + "/v1/models", timeout=10.0)
        data = resp.json()["data"]
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


async def prepare_prompts(http: httpx.AsyncClient, target: Target, settings: Settings) -> PromptSet:
    tokenizer = RemoteTokenizer(http, target.base_url, target.model)
    return await sample_prompts(
        settings.dataset, settings.num_prompts, settings.input_len, settings.output_len,
        settings.seed, tokenizer.count,
    )


def describe_counters(c: LiveCounters, tok_per_s: float) -> str:
    return (
        f"sent {c.sent} | in flight {c.in_flight} | done {c.done} | failed {c.failed}"
        f" | {tok_per_s:.0f} out tok/s"
    )


@contextlib.asynccontextmanager
async def live_progress(
    console: Console, total: int, label: str, counters: LiveCounters, show: bool
) -> AsyncIterator[Progress]:
    """A progress bar whose text is refreshed twice a second with the live counters."""
    progress = Progress(
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("{task.description}"), console=console, disable=not show,
    )
    task = progress.add_task(describe_counters(counters, 0.0), total=total)
    started = time.perf_counter()

    async def refresh() -> None:
        last_events, last_t = 0, time.perf_counter()
        while True:
            await asyncio.sleep(0.5)
            now = time.perf_counter()
            rate = (counters.content_events - last_events) / (now - last_t)
            last_events, last_t = counters.content_events, now
            progress.update(task, completed=counters.done + counters.failed,
                            description=describe_counters(counters, rate))

    with progress:
        ticker = asyncio.create_task(refresh())
        try:
            yield progress
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            mean_rate = counters.content_events / max(time.perf_counter() - started, 1e-9)
            progress.update(task, completed=counters.done + counters.failed,
                            description=describe_counters(counters, mean_rate) + " (mean)")


async def run_rate(
    http: httpx.AsyncClient, target: Target, prompts: list[PromptSpec], rate: float,
    settings: Settings, console: Console, concurrency: int | None = None,
) -> RateResult:
    """Replay the seeded trace at one offered rate and summarize it.

    `concurrency` (default: settings.max_concurrency) caps the requests in flight; at an
    infinite rate that is a closed loop: a new request starts as soon as one finishes."""
    concurrency = concurrency or settings.max_concurrency
    arrivals = arrival_times(len(prompts), rate, settings.burstiness, settings.seed)
    records = [
        RequestRecord(index=i, prompt_len=p.prompt_len, max_tokens=p.output_len, arrival=float(a))
        for i, (p, a) in enumerate(zip(prompts, arrivals, strict=True))
    ]
    counters = LiveCounters()
    limit = asyncio.Semaphore(concurrency) if concurrency else None
    scraper = MetricsScraper(http, target.base_url, interval=settings.scrape_interval)
    run_start = time.perf_counter()
    await scraper.start(run_start)

    async def one(record: RequestRecord, prompt: PromptSpec) -> None:
        await asyncio.sleep(max(0.0, record.arrival - (time.perf_counter() - run_start)))
        async with limit if limit is not None else contextlib.nullcontext():
            counters.sent += 1
            counters.in_flight += 1
            payload = build_payload(target, prompt.prompt, prompt.output_len, settings.ignore_eos)
            await send_request(http, target, payload, record, run_start, counters)
            counters.in_flight -= 1
        if record.success:
            counters.done += 1
        else:
            counters.failed += 1

    label = f"rate {format_rate(rate)}" + (f" x{concurrency}" if concurrency else "")
    async with live_progress(console, len(records), label, counters, settings.show_progress):
        await asyncio.gather(*(one(r, p) for r, p in zip(records, prompts, strict=True)))
    duration = time.perf_counter() - run_start
    await scraper.stop()
    summary = summarize(records, duration, settings.slo, settings.percentiles)
    server = scraper.summary()
    summary["offered_rate"] = rate_to_json(rate)
    summary["queue_time_server_mean_s"] = server.get("queue_time_mean_s")
    summary["max_concurrency"] = concurrency
    return RateResult(rate, summary, server, records, scraper.samples, concurrency)


def format_rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}/s"


def rate_to_json(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate

