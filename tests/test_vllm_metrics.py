"""vLLM's metric names beside pagode's (--metrics-compat), rendered by prometheus_client from
one engine snapshot; tests/test_kv_events_server.py scrapes them from a real server."""

from __future__ import annotations

import pytest
from server_fixtures import metric_value

from engine.types.info import EngineInfo
from engine.types.stats import EngineStats
from server.runtime.metrics import ServerMetrics
from server.settings import ServerSettings

STATS = EngineStats(num_running=3, num_waiting=2, kv_cache_usage=0.375, prefix_cache_queries_total=480,
                    prefix_cache_hits_total=96)
INFO = EngineInfo(model="m", num_blocks=1234, block_size=16, max_model_len=2048, batching="paged", device="cpu",
                  dtype="float32", attention="cpu", kv_cache_dtype="fp16", kv_tokens_per_gib=1000, cpu="x",
                  cpu_isa="avx2", cpu_flags="avx2")


def render(compat: str) -> str:
    metrics = ServerMetrics("served", 2048, 512, read_stats=lambda: STATS, read_queued=lambda: 0,
                            cache_info=INFO, compat=compat)
    return metrics.render().decode()


def test_vllm_names_carry_pagodes_numbers() -> None:
    text = render("vllm")
    labels = {"model_name": "served", "engine": "0"}
    for name, value in (("num_requests_running", 3), ("num_requests_waiting", 2), ("kv_cache_usage_perc", 0.375),
                        ("prefix_cache_queries_total", 480), ("prefix_cache_hits_total", 96)):
        assert metric_value(text, "vllm:" + name, labels) == value
        assert metric_value(text, "pagode:" + name, {"model_name": "served"}) == value
    assert "# TYPE vllm:prefix_cache_hits_total counter" in text  # as prometheus_client writes vLLM's
    assert "# TYPE vllm:kv_cache_usage_perc gauge" in text
    assert metric_value(text, "vllm:cache_config_info", {"block_size": "16", "num_gpu_blocks": "1234"}) == 1
    assert metric_value(text, "vllm:lora_requests_info",
                        {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}) > 0


def test_metrics_compat_none_keeps_pagodes_series_only() -> None:
    text = render("none")
    assert "vllm:" not in text
    assert metric_value(text, "pagode:num_requests_waiting") == 2


def test_the_setting_takes_vllm_or_none() -> None:
    assert ServerSettings().metrics_compat == "vllm"
    with pytest.raises(ValueError, match="metrics_compat must be one of vllm, none"):
        ServerSettings(metrics_compat="sglang")
