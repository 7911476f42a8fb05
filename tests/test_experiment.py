"""`make experiment` end to end, at the smallest size that still runs its whole path: the
driver as a program, a real `pagode serve` per batching mode, a low load and an overload of
a few requests each, then the results, summary and plots it writes.

The servers run the shipped `auto` weights; only the fused-decode limit is pinned, since
measuring it at load is the slowest part of a start and says nothing about the driver.
The KV budget holds two whole-context reservations, so `static` and `continuous` are
capped at two sequences, and the scraped gauge must show it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests_support import cache_sharing_builds

from engine import envs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

ROOT = Path(__file__).resolve().parents[1]
MODES = ["static", "continuous", "paged"]
NUM_PROMPTS = 3
MAX_MODEL_LEN = 64
RESERVED = 2  # whole-context sequences the KV budget holds
BYTES_PER_POSITION = 2 * 30 * 3 * 64 * 2  # SmolLM2-135M's K and V in fp16, as the driver pins
# Outputs long enough that a request runs for several scrape intervals: shorter ones can
# start and finish between two scrapes, and the gauge then never sees them run.
INPUT_LEN, OUTPUT_LEN = (8, 16), (16, 24)


def private_cache(tmp_path: Path) -> Path:
    """A cache of its own, without any step-time fit that would size the servers' batches,
    sharing the compiled kernels, tokenizers and this run's kernel races so that no server
    rebuilds or races them again."""
    return cache_sharing_builds(tmp_path / "cache", envs.CACHE_DIR.get(), races=True)


def run_experiment(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    out, raw = tmp_path / "docs", tmp_path / "raw"
    argv = ["--num-prompts", str(NUM_PROMPTS), "--low-rate", "4", "--high-rate", "40",
            "--input-len", f"{INPUT_LEN[0]}:{INPUT_LEN[1]}", "--output-len", f"{OUTPUT_LEN[0]}:{OUTPUT_LEN[1]}",
            "--max-model-len", str(MAX_MODEL_LEN),
            "--kv-cache-memory", str(RESERVED * MAX_MODEL_LEN * BYTES_PER_POSITION),
            "--server-arg=--fused-decode-limit=64", "--scrape-interval", "0.05", "--no-progress",
            "--out", str(out), "--raw-out", str(raw)]
    env = {**os.environ, "PAGODE_CACHE_DIR": str(private_cache(tmp_path))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.experiment", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, raw, argv


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def check_run(mode: str, run: dict[str, Any]) -> None:
    summary, server = run["summary"], run["server"]
    assert summary["completed"] == NUM_PROMPTS and summary["failed"] == 0, summary["errors"]
    for key in ("request_throughput", "output_throughput", "duration_s"):
        assert finite(summary[key]) and summary[key] > 0, (mode, key, summary[key])
    for key in ("ttft_s", "itl_s", "e2e_s"):
        assert finite(summary[key]["p50"]) and summary[key]["p50"] <= summary[key]["p99"], (mode, key)
    for rec in run["requests"]:
        assert rec["success"] and rec["output_tokens"] == rec["max_tokens"]  # ignore_eos
        assert OUTPUT_LEN[0] <= rec["max_tokens"] <= OUTPUT_LEN[1]
        assert INPUT_LEN[0] <= rec["prompt_tokens"] <= INPUT_LEN[1]  # cut with the server's /tokenize
        assert "content_times" not in rec and rec["num_content_events"] >= 1
    # Scraped from the server's /metrics: it counted every request, and a whole-context
    # reservation per sequence capped the running batch.
    assert server["available"] and server["queue_time_count"] == NUM_PROMPTS
    assert server["max_running"] <= (RESERVED if mode != "paged" else NUM_PROMPTS)
    if run["load"] == "high":  # every request arrives before the first one ends
        assert server["max_running"] >= 1


def test_experiment_serves_every_batching_mode_and_writes_its_report(tmp_path: Path) -> None:
    out, raw, argv = run_experiment(tmp_path)

    doc = json.loads((out / "results.json").read_text())
    assert list(doc["batching"]) == MODES
    for mode, results in doc["batching"].items():
        runs = results["runs"]
        assert [(r["load"], r["offered_rate"]) for r in runs] == [("low", 4.0), ("high", 40.0)]
        for run in runs:
            check_run(mode, run)
        # The full records, with every event time, go to --raw-out with the server's log.
        full = json.loads((raw / mode / "results.json").read_text())
        assert all(len(rec["content_times"]) >= 1 for run in full["runs"] for rec in run["requests"])
        assert "Serving" in (raw / f"server_{mode}.log").read_text()

    summary = (out / "summary.md").read_text()
    rows = [line for line in summary.splitlines() if line.startswith(tuple(f"| {m} |" for m in MODES))]
    assert len(rows) == 2 * len(MODES) and all(f"| {NUM_PROMPTS} / 0 |" in row for row in rows)
    assert f"({RESERVED} sequences of {MAX_MODEL_LEN} positions for static/continuous)" in summary
    ratios = [line for line in summary.split("## Key ratios")[1].splitlines() if line.startswith("- ")]
    assert len(ratios) == 5
    assert not [line for line in ratios if "x-" in line or " - " in line]  # every ratio has its numbers
    assert f"Reproduce: `python -m benchmarks.experiment {' '.join(argv)}`" in summary
    for png in ("latency_cdf_low", "latency_cdf_high", "server_timeline_low", "server_timeline_high",
                "summary_bars"):
        assert (out / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / f"{png}.png").stat().st_size > 10_000
