"""loadgen against a real `pagode serve` on loopback: no failures, and token counts
that match the server's own usage and Prometheus counters.

The server is the session's shared one, a separate process (`python -m server.cli serve`)
started the way a user would run it; loadgen itself never imports the server or the engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_fixtures import ServerProcess

from loadgen.cli import main
from loadgen.scrape import parse_prometheus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def pagode_url(server: ServerProcess) -> str:
    """The session's shared server: every count here is a difference over a run, so the
    requests other tests sent it change nothing."""
    return server.base_url


def counters(url: str) -> dict[str, float]:
    return parse_prometheus(httpx.get(url + "/metrics", timeout=10).text)


def run(url: str, out: Path, *extra: str) -> dict[str, Any]:
    code = main(["--url", url, "--seed", "1", "--ignore-eos", "--no-progress", "--no-plots",
                 "--scrape-interval", "0.5", "--out", str(out), *extra])
    assert code == 0
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def test_short_run_matches_the_servers_usage(pagode_url: str, tmp_path: Path) -> None:
    before = counters(pagode_url)
    results = run(pagode_url, tmp_path, "--rate", "8", "--num-prompts", "12",
                  "--input-len", "16:64", "--output-len", "4:16")
    after = counters(pagode_url)
    assert results["dataset"]["exact_prompt_lengths"] and results["dataset"]["warnings"] == []
    assert results["dataset"]["prompts_off_target"] == 0
    run_ = results["runs"][0]
    summary, requests = run_["summary"], run_["requests"]
    assert summary["completed"] == 12 and summary["failed"] == 0, summary["errors"]
    for rec in requests:
        assert rec["usage_reported"]
        # ignore_eos: the server generates exactly what was asked, and says so in usage.
        assert rec["output_tokens"] == rec["max_tokens"] and rec["finish_reason"] == "length"
        assert 1 <= len(rec["content_times"]) <= rec["output_tokens"]
        # Prompts were cut with the server's /tokenize, so its usage agrees with the plan.
        assert rec["prompt_tokens"] == rec["prompt_len"] and 16 <= rec["prompt_len"] <= 64
        assert 0 < rec["ttft"] <= rec["e2e"]
    # The server's counters moved by exactly what loadgen measured.
    gen = "pagode:generation_tokens_total"
    assert after[gen] - before[gen] == summary["total_output_tokens"]
    done = "pagode:request_success_total"
    assert after[done] - before[done] == 12
    assert run_["server"]["available"] and run_["server"]["max_running"] >= 1
    assert run_["server"]["queue_time_count"] == 12
    assert run_["server"]["queue_time_mean_s"] is not None and run_["server"]["queue_time_mean_s"] >= 0


def test_chat_endpoint_against_pagode(pagode_url: str, tmp_path: Path) -> None:
    results = run(pagode_url, tmp_path, "--endpoint", "/v1/chat/completions", "--rate", "inf",
                  "--num-prompts", "4", "--input-len", "16:32", "--output-len", "4:8")
    summary = results["runs"][0]["summary"]
    assert summary["completed"] == 4 and summary["failed"] == 0, summary["errors"]
    for rec in results["runs"][0]["requests"]:
        assert rec["output_tokens"] == rec["max_tokens"]
        # The chat template adds its own tokens around the user's prompt.
        assert rec["prompt_tokens"] > rec["prompt_len"]


def test_closed_loop_concurrency_sweep(pagode_url: str, tmp_path: Path) -> None:
    results = run(pagode_url, tmp_path, "--max-concurrency", "1", "3", "--num-prompts", "6",
                  "--input-len", "16:32", "--output-len", "4:8", "--percentiles", "50,99.9")
    runs = results["runs"]
    assert [r["max_concurrency"] for r in runs] == [1, 3]
    for r, cap in zip(runs, (1, 3), strict=True):
        assert r["summary"]["completed"] == 6
        assert r["summary"]["max_concurrent_streaming"] <= cap
        assert r["vllm"]["max_concurrency"] == cap and r["vllm"]["request_rate"] == "inf"
        assert r["vllm"]["p99.9_ttft_ms"] >= r["vllm"]["median_ttft_ms"] > 0
    assert runs[0]["summary"]["max_concurrent_streaming"] == 1


def test_sweep_reports_capacity_at_an_slo(pagode_url: str, tmp_path: Path) -> None:
    easy = run(pagode_url, tmp_path / "easy", "--sweep", "--sweep-max-runs", "2", "--rate", "2",
               "--slo", "e2e=600", "--num-prompts", "4", "--input-len", "16", "--output-len", "4")
    assert easy["sweep"]["capacity_rate"] == 4.0  # met at 2 and at 4 req/s: two runs spent
    assert [p["rate"] for p in easy["sweep"]["probes"]] == [2.0, 4.0] and len(easy["runs"]) == 2
    # vLLM's key names sit at the top level only for a single run
    assert "request_throughput" not in easy
    impossible = run(pagode_url, tmp_path / "hard", "--sweep", "--sweep-max-runs", "2", "--rate", "2",
                     "--slo", "ttft=0.001", "--num-prompts", "4", "--input-len", "16", "--output-len", "4")
    assert impossible["sweep"]["capacity_rate"] is None
    assert [p["rate"] for p in impossible["sweep"]["probes"]] == [2.0, 1.0]


def test_single_run_has_vllm_keys_at_the_top(pagode_url: str, tmp_path: Path) -> None:
    res = run(pagode_url, tmp_path, "--rate", "inf", "--num-prompts", "3", "--input-len", "16",
              "--output-len", "4")
    for key in ("date", "backend", "model_id", "num_prompts", "request_rate", "burstiness",
                "max_concurrency", "duration", "completed", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                "median_tpot_ms", "std_itl_ms", "p99_itl_ms", "p99_e2el_ms"):
        assert key in res, key
    assert res["completed"] == 3 and res["total_output_tokens"] == 12 and res["request_rate"] == "inf"
