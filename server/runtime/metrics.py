"""Prometheus metrics under the `pagode:` prefix, with vLLM's names and meanings.

Gauges and engine-wide token counters are read from engine.types.stats() at scrape time, so
they cannot drift from the engine. Per-request histograms are fed by the server when a
request finishes (it sees every request end, aborts included), ITL from each delta, and
iteration sizes from the engine's step listener.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.types.info import EngineInfo
from engine.types.spec_counters import SpecCounters
from engine.types.stats import EngineStats, StepStats
from server.runtime.endpoint_metrics import EndpointCollector
from server.runtime.response_stats import ResponseStats
from server.runtime.vllm_metrics import VllmCompatCollector

PREFIX = "pagode:"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# vLLM's buckets, with finer steps where CPU latencies fall (steps of tens to hundreds
# of ms; TTFT and E2E of seconds under load) so p50 and p99 stay resolvable.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4,
                0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
                40.0, 60.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125,
               0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_TIME_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5,
                        2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                        90.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("queue_full", "draining", "not_ready")


def build_1_2_5_buckets(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to limit, as vLLM does for token counts."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return buckets
            buckets.append(float(value))
        exponent += 1


def build_power_of_2_buckets(limit: int) -> list[float]:
    buckets = [1.0]
    while buckets[-1] < limit:
        buckets.append(buckets[-1] * 2)
    return buckets


class LatencyWatcher(Protocol):
    """Sees each latency the histograms see (the live view's sampler)."""

    def observe_ttft(self, seconds: float) -> None: ...

    def observe_itl(self, seconds: float, num_tokens: int) -> None: ...


class EngineSnapshotCollector(Collector):
    """Gauges and counters the engine keeps, read at scrape time."""

    def __init__(self, model_name: str, read_stats: Callable[[], EngineStats | None],
                 read_queued: Callable[[], int]) -> None:
        self.model_name = model_name
        self.read_stats = read_stats
        self.read_queued = read_queued

    def collect(self) -> Iterable[Metric]:
        stats = self.read_stats() or EngineStats()
        gauges: list[tuple[str, str, float]] = [
            ("num_requests_running", "Requests in the running batch.", stats.num_running),
            ("num_requests_waiting", "Requests waiting in the engine's queue.",
             stats.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV-cache blocks held by live requests (0-1).",
             stats.kv_cache_usage),
            ("num_requests_queued", "Requests admitted by the server and waiting for their "
             "first token (the queue that --max-num-queued-reqs bounds).", self.read_queued()),
        ]
        for name, doc, value in gauges:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(value))
            yield family
        counters: list[tuple[str, str, int]] = [
            ("num_preemptions", "Preemptions (recomputation) since start.",
             stats.num_preemptions_total),
            ("prompt_tokens", "Prefill tokens processed.", stats.prompt_tokens_total),
            ("generation_tokens", "Tokens generated.", stats.generation_tokens_total),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             stats.prefix_cache_queries_total),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             stats.prefix_cache_hits_total),
        ]
        for name, doc, total in counters:
            counter = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            counter.add_metric([self.model_name], float(total))
            yield counter
        if stats.spec_decode is not None:
            yield from spec_decode_families(self.model_name, stats.spec_decode)


def spec_decode_families(model_name: str, spec: SpecCounters) -> Iterable[Metric]:
    """vLLM's spec-decode counters (v1/spec_decode/metrics.py), only when the engine speculates,
    as vLLM does; acceptance rate and mean acceptance length are ratios of their deltas."""
    counters: list[tuple[str, str, int]] = [
        ("spec_decode_num_drafts", "Request-steps that verified at least one draft token.", spec.num_drafts),
        ("spec_decode_num_draft_tokens", "Draft tokens proposed and verified.", spec.num_draft_tokens),
        ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec.num_accepted_tokens),
    ]
    for name, doc, total in counters:
        counter = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        counter.add_metric([model_name], float(total))
        yield counter
    per_pos = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                  "Draft tokens accepted, by their position in the draft.",
                                  labels=["model_name", "position"])
    for position, total in enumerate(spec.accepted_per_pos):
        per_pos.add_metric([model_name, str(position)], float(total))
    yield per_pos


class ResponseCollector(Collector):
    """HTTP responses by status code and OpenAI error type ("none" for successes), read
    from the counts that server/middleware/response_metrics.py keeps."""

    def __init__(self, model_name: str, stats: ResponseStats) -> None:
        self.model_name = model_name
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            PREFIX + "http_responses", "HTTP responses by status code and error type "
            "(errors sent inside a started SSE stream count under their own code).",
            labels=["model_name", "code", "error_type"])
        for (code, kind), count in sorted(self.stats.responses.items()):
            family.add_metric([self.model_name, code, kind], float(count))
        yield family


class ServerMetrics:
    """All series of one served model, in a registry of their own."""

    def __init__(self, model_name: str, max_model_len: int, max_num_batched_tokens: int,
                 read_stats: Callable[[], EngineStats | None],
                 read_queued: Callable[[], int],
                 responses: ResponseStats | None = None,
                 cache_info: EngineInfo | None = None, compat: str = "vllm") -> None:
        disable_created_metrics()  # no *_created series: dashboards do not use them
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineSnapshotCollector(model_name, read_stats, read_queued))
        if compat == "vllm":
            self.registry.register(VllmCompatCollector(model_name, read_stats, cache_info))
        responses = responses or ResponseStats()
        self.registry.register(ResponseCollector(model_name, responses))
        self.registry.register(EndpointCollector(model_name, responses))
        self.engine_failures = Counter(
            PREFIX + "request_engine_failures", "Requests that failed inside the engine "
            "(an exception while sampling or post-processing them).", ["model_name"],
            registry=self.registry).labels(model_name)
        labels = ["model_name"]
        self.request_success = Counter(
            PREFIX + "request_success", "Finished requests by finish reason.",
            ["model_name", "finished_reason"], registry=self.registry)
        self.rejected = Counter(
            PREFIX + "num_requests_rejected", "Requests refused before reaching the engine "
            "(queue_full: 429; draining, not_ready: 503).", ["model_name", "reason"],
            registry=self.registry)
        self.ttft = self._histogram("time_to_first_token_seconds", "Time to first token.",
                                    TTFT_BUCKETS, labels)
        self.itl = self._histogram("inter_token_latency_seconds", "Gap between tokens.",
                                   ITL_BUCKETS, labels)
        self.e2e = self._histogram("e2e_request_latency_seconds", "Arrival to finish.",
                                   REQUEST_TIME_BUCKETS, labels)
        self.queue_time = self._histogram("request_queue_time_seconds",
                                          "Arrival to first scheduling.",
                                          REQUEST_TIME_BUCKETS, labels)
        self.prompt_tokens = self._histogram("request_prompt_tokens", "Prompt length.",
                                             build_1_2_5_buckets(max_model_len), labels)
        self.generation_tokens = self._histogram("request_generation_tokens", "Output length.",
                                                 build_1_2_5_buckets(max_model_len), labels)
        self.iteration_tokens = self._histogram(
            "iteration_tokens_total", "Tokens in one engine step (prefill + decode).",
            build_power_of_2_buckets(max_num_batched_tokens), labels)
        if cache_info:
            self._cache_config_info(cache_info)
            self._cpu_info(cache_info)
            self._load_race_info(cache_info)
        self.watchers: list[LatencyWatcher] = []
        for reason in FINISH_REASONS:  # present from the start, at 0
            self.request_success.labels(model_name, reason)
        for reason in REJECT_REASONS:
            self.rejected.labels(model_name, reason)

    def _cache_config_info(self, info: EngineInfo) -> None:
        """vLLM's cache_config_info: a constant 1 whose labels are the KV cache's real shape."""
        labels = info.cache_labels()
        gauge = Gauge(PREFIX + "cache_config_info", "KV cache configuration (labels; value 1).",
                      ["model_name", *labels], registry=self.registry)
        gauge.labels(self.model_name, *labels.values()).set(1)

    def _cpu_info(self, info: EngineInfo) -> None:
        """A constant 1 whose labels say which CPU serves and which kernels it runs."""
        labels = info.cpu_labels()
        gauge = Gauge(PREFIX + "cpu_info", "The CPU and the ISA level of its kernels (labels; value 1).",
                      ["model_name", *labels], registry=self.registry)
        gauge.labels(self.model_name, *labels.values()).set(1)

    def _load_race_info(self, info: EngineInfo) -> None:
        """A constant 1 per load-time kernel race: which kernel won on this CPU for each shape,
        and whether this start measured it or read it back."""
        gauge = Gauge(PREFIX + "load_race_info", "What each load-time kernel race chose: race, shape key, "
                      "choice, measured or kept (labels; value 1).",
                      ["model_name", "race", "key", "choice", "source"], registry=self.registry)
        for kernel in info.kernels:
            gauge.labels(self.model_name, *kernel.labels().values()).set(1)

    def _histogram(self, name: str, doc: str, buckets: list[float],
                   labels: list[str]) -> Any:
        histogram = Histogram(PREFIX + name, doc, labels, buckets=buckets,
                              registry=self.registry)
        return histogram.labels(self.model_name)

    def observe_step(self, step: StepStats) -> None:
        if step.num_tokens > 0:
            self.iteration_tokens.observe(step.num_tokens)

    def observe_itl(self, gap: float, num_tokens: int) -> None:
        for _ in range(num_tokens):
            self.itl.observe(gap)
        for watcher in self.watchers:
            watcher.observe_itl(gap, num_tokens)

    def observe_finished(self, finish_reason: str, num_prompt_tokens: int,
                         num_output_tokens: int, queue_time: float | None,
                         ttft: float | None, e2e: float) -> None:
        if finish_reason in FINISH_REASONS:
            self.request_success.labels(self.model_name, finish_reason).inc()
        self.prompt_tokens.observe(num_prompt_tokens)
        self.generation_tokens.observe(num_output_tokens)
        self.e2e.observe(e2e)
        if queue_time is not None:
            self.queue_time.observe(queue_time)
        if ttft is not None:
            self.ttft.observe(ttft)
            for watcher in self.watchers:
                watcher.observe_ttft(ttft)

    def observe_engine_failure(self) -> None:
        self.engine_failures.inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
