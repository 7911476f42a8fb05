"""Once an engine is loaded, a step's big tensors reuse the pages the previous step freed
instead of mapping (and faulting in) fresh ones each time. Measured in a fresh process each
way, since the setting is process-wide and a long test session's heap is fragmented by all
the engines before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine.runner.heap import glibc

BIG = 16 * 2**20  # floats: a 64 MiB tensor, twice glibc's largest mmap threshold
PAGES = BIG * 4 // 4096

MEASURE = f"""
import resource, torch
from engine.runner.heap import keep_freed_memory
def faults(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        torch.empty({BIG}).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
keep_freed_memory()
faults(3)  # the heap grows to hold one (and what small blocks split off it), once
print(faults(5))
"""


def faults_of_five_big_tensors(keep: str) -> int:
    env = {**os.environ, "PAGODE_HEAP_KEEP": keep}
    run = subprocess.run([sys.executable, "-c", MEASURE], env=env, capture_output=True, text=True, check=True)
    return int(run.stdout.split()[-1])


def test_big_tensors_reuse_freed_pages() -> None:
    if glibc() is None:
        pytest.skip("not glibc: its allocator settings do not apply")
    assert faults_of_five_big_tensors("1") < PAGES // 4
    assert faults_of_five_big_tensors("0") > 4 * PAGES  # glibc's default maps each afresh


def test_the_switch_leaves_glibcs_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.runner.heap import keep_freed_memory

    monkeypatch.setenv("PAGODE_HEAP_KEEP", "0")
    assert keep_freed_memory() is False
