"""Several replicas' Prometheus pages as one: each sample gains a `replica` label, and each
metric family is written once (a page that repeats a family's HELP/TYPE is invalid)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


class MergedPages:
    """A collector over parsed families, as generate_latest expects of a registry."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_metrics(pages: dict[str, str]) -> bytes:
    merged: dict[str, Metric] = {}
    for replica, text in sorted(pages.items()):
        for family in text_string_to_metric_families(text):
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            into.samples.extend(Sample(s.name, {**s.labels, "replica": replica}, s.value, s.timestamp, s.exemplar)
                                for s in family.samples)
    return generate_latest(MergedPages(list(merged.values())))  # type: ignore[arg-type]
