"""What this CPU can run, where it shows (start log, /metrics, `pagode plan`), and the cap
that lets an AVX-512 or AMX machine run and test the lower levels' paths."""

from __future__ import annotations

import re

import httpx
import pytest
from server_fixtures import ServerProcess

from cpu_kernels.isa import Level, detect
from engine import native


def labels_of(text: str, metric: str) -> dict[str, str]:
    line = next(x for x in text.splitlines() if x.startswith(metric + "{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def test_the_target_is_the_cpus_own_level_without_a_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGODE_CPU_ISA", raising=False)
    target = native.cpu_target()
    assert target.target == target.detected == detect().level.label
    assert target.cap is None and target.detected in target.describe()


@pytest.mark.parametrize("cap", ["avx2", "avx512", "amx"])  # what PAGODE_CPU_ISA accepts
def test_a_cap_lowers_the_target_and_never_raises_it(monkeypatch: pytest.MonkeyPatch, cap: str) -> None:
    monkeypatch.setenv("PAGODE_CPU_ISA", cap)
    target = native.cpu_target()
    assert target.target == min(Level.parse(cap), detect().level).label
    assert target.cap == cap and f"PAGODE_CPU_ISA={cap}" in target.describe()


def test_metrics_and_log_name_the_cpu_and_its_kernels(server: ServerProcess) -> None:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    labels = labels_of(text, "pagode:cpu_info")
    cpu = detect()
    assert labels["isa"] == cpu.level.label  # the session server runs without a cap
    assert labels["cpu"] == cpu.model
    assert set(labels["flags"].split()) == set(cpu.flags)
    assert f"CPU: {cpu.model}" in server.log()


def test_metrics_list_what_the_kernel_races_chose(server: ServerProcess) -> None:
    """Which kernel won each load-time race on this CPU shows on /metrics: the default model's
    block kernel against the GEMM, and its prefill path, at the least."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    rows = [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in text.splitlines()
            if line.startswith("pagode:load_race_info{")]
    assert {row["race"] for row in rows} >= {"block-kernel", "prefill-attention"}, rows
    assert all(row["source"] in ("measured", "kept") and row["choice"] for row in rows)
    prefill = [row["choice"] for row in rows if row["race"] == "prefill-attention"]
    assert set(prefill) <= {"kernel", "maskless"}
    assert "kernel races:" in server.log()
