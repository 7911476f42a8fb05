"""Scraping the server's Prometheus /metrics about once a second during a run.

It records queue depth, running batch size and KV-cache usage over time, and the
deltas of the preemption counter and of the queue-time histogram across the run.
Names are vLLM's under the `pagode:` or `vllm:` prefix; SGLang's `sglang:` and
llama-server's `llamacpp:` names are understood too. The exposition text is parsed by
`prometheus_client`'s own parser, so label values with braces, spaces, commas or escaped
quotes cannot mis-split a line. A server without /metrics is simply not scraped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

PREFIXES = ("pagode:", "vllm:")
# Field -> metric names without prefix, first found wins.
FIELDS: dict[str, tuple[str, ...]] = {
    "waiting": ("num_requests_waiting",),
    "running": ("num_requests_running",),
    "kv_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "preemptions": ("num_preemptions_total", "num_preemptions"),
    "queue_time_sum": ("request_queue_time_seconds_sum",),
    "queue_time_count": ("request_queue_time_seconds_count",),
    # Speculative decoding, vLLM's counters (absent when the server does not speculate).
    "spec_drafts": ("spec_decode_num_drafts_total",),
    "spec_draft_tokens": ("spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens": ("spec_decode_num_accepted_tokens_total",),
}
LLAMA_CPP = {
    "waiting": "llamacpp:requests_deferred",
    "running": "llamacpp:requests_processing",
    "kv_usage": "llamacpp:kv_cache_usage_ratio",
}
SGLANG = {
    "waiting": "sglang:num_queue_reqs",
    "running": "sglang:num_running_reqs",
    "kv_usage": "sglang:token_usage",
    "preemptions": "sglang:num_retracted_requests_total",  # the counter, not the per-batch gauge
    "queue_time_sum": "sglang:queue_time_seconds_sum",
    "queue_time_count": "sglang:queue_time_seconds_count",
}


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample name -> value summed over its label sets (e.g. several model_name).

    A malformed line is skipped alone: the text is parsed whole first, and line by
    line only if the whole does not parse."""
    values: dict[str, float] = {}
    try:
        _add_samples(text, values)
    except ValueError:
        values.clear()
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                _add_samples(line + "\n", values)
    return values


def _add_samples(text: str, values: dict[str, float]) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)


def extract_fields(metrics: dict[str, float]) -> dict[str, float | None]:
    """The fields loadgen tracks, None where the server does not export them."""
    out: dict[str, float | None] = {}
    for key, names in FIELDS.items():
        found = [metrics[p + n] for n in names for p in PREFIXES if p + n in metrics]
        for other in (SGLANG, LLAMA_CPP):
            if not found and other.get(key) in metrics:
                found = [metrics[other[key]]]
        out[key] = found[0] if found else None
    return out


@dataclass
class Sample:
    t: float  # seconds from the run start
    waiting: float | None
    running: float | None
    kv_usage: float | None
    preemptions: float | None
    queue_time_sum: float | None
    queue_time_count: float | None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None


def _delta(first: float | None, last: float | None) -> float | None:
    return None if first is None or last is None else last - first


def spec_summary(first: Sample, last: Sample) -> dict[str, float | None]:
    """The run's speculative-decoding counters and vLLM's two ratios of them: acceptance
    rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts. None
    where the server does not speculate."""
    drafts = _delta(first.spec_drafts, last.spec_drafts)
    draft_tokens = _delta(first.spec_draft_tokens, last.spec_draft_tokens)
    accepted = _delta(first.spec_accepted_tokens, last.spec_accepted_tokens)
    return {
        "spec_drafts": drafts,
        "spec_draft_tokens": draft_tokens,
        "spec_accepted_tokens": accepted,
        "spec_acceptance_rate": accepted / draft_tokens if accepted is not None and draft_tokens else None,
        "spec_mean_acceptance_length": 1.0 + accepted / drafts if accepted is not None and drafts else None,
    }


def _values(samples: list[Sample], key: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, key)) is not None]


@dataclass
class MetricsScraper:
    http: httpx.AsyncClient
    base_url: str
    interval: float = 1.0
    run_start: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    available: bool | None = None  # None until the first scrape answers
    _task: asyncio.Task[None] | None = None

    async def scrape_once(self) -> Sample | None:
        if self.available is False:
            return None
        try:
            resp = await self.http.get(self.base_url.rstrip("/") + "/metrics", timeout=5.0)
        except httpx.HTTPError:
            self.available = self.available or False
            return None
        if resp.status_code != 200:
            self.available = self.available or False
            return None
        fields = extract_fields(parse_prometheus(resp.text))
        if all(v is None for v in fields.values()):
            self.available = self.available or False
            return None
        self.available = True
        sample = Sample(t=time.perf_counter() - self.run_start, **fields)
        self.samples.append(sample)
        return sample

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.scrape_once()

    async def start(self, run_start: float) -> None:
        """A first sample before the run, then one per interval."""
        self.run_start = run_start
        await self.scrape_once()
        if self.available:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """Stop the loop and take a last sample, for the counters' deltas."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            await self.scrape_once()

    def summary(self) -> dict[str, Any]:
        s = self.samples
        if not s:
            return {"available": False}
        running, waiting, kv = (_values(s, k) for k in ("running", "waiting", "kv_usage"))
        q_sum = _delta(s[0].queue_time_sum, s[-1].queue_time_sum)
        q_count = _delta(s[0].queue_time_count, s[-1].queue_time_count)
        return {
            **spec_summary(s[0], s[-1]),
            "available": True,
            "samples": len(s),
            "max_running": max(running, default=None),
            "mean_running": sum(running) / len(running) if running else None,
            "max_waiting": max(waiting, default=None),
            "max_kv_usage": max(kv, default=None),
            "preemptions": _delta(s[0].preemptions, s[-1].preemptions),
            "queue_time_count": q_count,
            # The server's own mean queue time over this run, from its histogram.
            "queue_time_mean_s": q_sum / q_count if q_sum is not None and q_count else None,
        }
