"""/metrics of a server of several models: each model's series (labelled `model_name`, as
vLLM's are) in one exposition, each metric family once with the samples of every model.

Each model keeps its own registry (server/runtime/metrics.py), so its counters survive an
unload; Prometheus' text format allows a family's HELP and TYPE only once, so the families
are merged here, at scrape time, not concatenated.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from server.runtime.metrics import ServerMetrics


class MergedFamilies(Collector):
    def __init__(self, sources: list[ServerMetrics]) -> None:
        self.sources = sources

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for source in self.sources:
            for family in source.registry.collect():
                if family.name not in merged:
                    merged[family.name] = copy.copy(family)
                    merged[family.name].samples = list(family.samples)
                else:
                    merged[family.name].samples.extend(family.samples)
        return merged.values()


def render_models(sources: list[ServerMetrics]) -> bytes:
    if len(sources) == 1:
        return sources[0].render()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedFamilies(sources))
    return generate_latest(registry)
