"""vLLM's names for the series a fleet reads (--metrics-compat vllm, the default).

The endpoint picker of the Gateway API Inference Extension (llm-d), KEDA triggers and
Prometheus adapters written for vLLM ask for `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`, `vllm:lora_requests_info`, `vllm:cache_config_info`, ...; pagode's
own series carry the same meanings under `pagode:`. This collector republishes them under
vLLM's names and labels (`model_name`, and `engine="0"` as vLLM's V1 engine adds), read at
scrape time from the very snapshot that pagode's collector reads, so the two never disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.types.info import EngineInfo
from engine.types.stats import EngineStats

PREFIX = "vllm:"
ENGINE = "0"  # vLLM numbers its engine cores; a pagode server runs one


class VllmCompatCollector(Collector):
    def __init__(self, model_name: str, read_stats: Callable[[], EngineStats | None],
                 cache_info: EngineInfo | None) -> None:
        self.model_name = model_name
        self.read_stats = read_stats
        self.cache_info = cache_info

    def collect(self) -> Iterable[Metric]:
        stats = self.read_stats() or EngineStats()
        labels = ["model_name", "engine"]
        values = [self.model_name, ENGINE]
        gauges: list[tuple[str, str, float]] = [
            ("num_requests_running", "Number of requests in model execution batches.", stats.num_running),
            ("num_requests_waiting", "Number of requests waiting to be processed.", stats.num_waiting),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_cache_usage),
        ]
        for name, doc, value in gauges:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            family.add_metric(values, float(value))
            yield family
        counters: list[tuple[str, str, int]] = [
            ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
             stats.prefix_cache_queries_total),
            ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             stats.prefix_cache_hits_total),
        ]
        for name, doc, total in counters:
            counter = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            counter.add_metric(values, float(total))
            yield counter
        yield self._lora_info(stats)
        if self.cache_info is not None:
            yield self._cache_config_info(self.cache_info)

    def _lora_info(self, stats: EngineStats) -> Metric:
        """The adapters of waiting and running requests, comma-separated as vLLM writes them;
        vLLM's value is the time of the last update, which pickers compare."""
        family = GaugeMetricFamily(PREFIX + "lora_requests_info", "Running stats on lora requests.",
                                   labels=["model_name", "max_lora", "waiting_lora_adapters",
                                           "running_lora_adapters"])
        family.add_metric([self.model_name, str(stats.max_loras), ",".join(stats.waiting_lora_adapters),
                           ",".join(stats.running_lora_adapters)], time.time())
        return family

    def _cache_config_info(self, info: EngineInfo) -> Metric:
        """A constant 1 whose labels are the cache's shape, under vLLM's label names."""
        shape = {"block_size": str(info.block_size), "num_gpu_blocks": str(info.num_blocks),
                 "cache_dtype": info.kv_cache_dtype}
        family = GaugeMetricFamily(PREFIX + "cache_config_info", "Information of the LLMEngine CacheConfig",
                                   labels=["model_name", "engine", *shape])
        family.add_metric([self.model_name, ENGINE, *shape.values()], 1.0)
        return family
