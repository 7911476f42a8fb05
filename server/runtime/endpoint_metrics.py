"""Requests and errors per endpoint, read at scrape time from the server's ResponseStats.

`http_requests_total{handler, method, status}` is the series vLLM serves through
prometheus-fastapi-instrumentator, with its name, labels and meaning (no prefix, the
status grouped as "2xx", counted when the response starts), so that a dashboard's
per-endpoint panels for vLLM read pagode as they are. A stream that fails after its 200
still counts as a 2xx there; `pagode:http_request_errors_total{model_name, handler,
method, code, error_type}` counts every error per endpoint under its own code, those sent
inside a started stream included."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from server.runtime.response_stats import ResponseStats

PREFIX = "pagode:"


class EndpointCollector(Collector):
    def __init__(self, model_name: str, stats: ResponseStats) -> None:
        self.model_name = model_name
        self.stats = stats

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "http_requests_total", "Total number of requests by method, status and handler.",
            labels=["handler", "method", "status"])
        for (handler, method, status), count in sorted(self.stats.requests.items()):
            requests.add_metric([handler, method, status], float(count))
        yield requests
        errors = CounterMetricFamily(
            PREFIX + "http_request_errors", "Error responses by endpoint, status code and "
            "error type (errors sent inside a started stream included).",
            labels=["model_name", "handler", "method", "code", "error_type"])
        for (handler, method, code, kind), count in sorted(self.stats.errors.items()):
            errors.add_metric([self.model_name, handler, method, code, kind], float(count))
        yield errors
