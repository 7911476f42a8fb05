"""Once an engine is loaded, a step's big tensors reuse the pages the previous step freed
instead of mapping (and faulting in) fresh ones each time."""

from __future__ import annotations

import resource

import pytest
import torch

from engine.runner.heap import keep_freed_memory

BIG = 16 * 2**20  # floats: a 64 MiB tensor, twice glibc's largest mmap threshold
PAGES = BIG * 4 // 4096


def faults_of_big_tensors(rounds: int) -> int:
    """Minor page faults taken while allocating, filling and freeing a big tensor `rounds` times."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        torch.empty(BIG).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_big_tensors_reuse_freed_pages() -> None:
    if not keep_freed_memory():
        pytest.skip("not glibc: its allocator settings do not apply")
    faults_of_big_tensors(3)  # the heap grows to hold one (and what small blocks split off it), once
    assert faults_of_big_tensors(5) < PAGES // 4  # a fresh mapping each round would fault 5 x PAGES


def test_the_switch_leaves_glibcs_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_HEAP_KEEP", "0")
    assert keep_freed_memory() is False
