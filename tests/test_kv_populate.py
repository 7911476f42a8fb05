"""The KV cache's pages are mapped ahead of the blocks steps use, from a background thread,
without changing what the blocks hold."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
import time

import pytest
import torch

from engine.runner.kv_cache import lazily_zeroed
from engine.runner.kv_populate import PAGE, KvPopulator, populate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux's")


def all_resident(tensor: torch.Tensor) -> bool:
    """Whether every page the tensor spans is mapped (mincore)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    start = tensor.data_ptr() // PAGE * PAGE
    length = tensor.data_ptr() + tensor.numel() * tensor.element_size() - start
    vec = (ctypes.c_ubyte * (-(-length // PAGE)))()
    assert libc.mincore(start, length, vec) == 0, ctypes.get_errno()
    return all(v & 1 for v in vec)


def caches(layers: int = 3, blocks: int = 64) -> list[torch.Tensor]:
    return [lazily_zeroed((2, blocks, 16, 2, 64), torch.float16) for _ in range(layers)]


def test_populate_maps_pages_and_keeps_their_contents() -> None:
    fresh = mmap.mmap(-1, 64 * PAGE)  # anonymous and never touched: no page mapped yet
    pages = torch.frombuffer(fresh, dtype=torch.uint8)
    assert not all_resident(pages)
    pages[5 * PAGE:6 * PAGE].fill_(3)  # a block a step wrote
    first = pages[:16 * PAGE]
    assert populate(first.data_ptr(), first.numel())
    assert all_resident(first)
    assert not all_resident(pages[16 * PAGE:])  # not asked for
    assert torch.count_nonzero(pages[5 * PAGE:6 * PAGE] != 3) == 0
    assert torch.count_nonzero(pages[:5 * PAGE]) == 0 and torch.count_nonzero(pages[6 * PAGE:]) == 0
    del first, pages


def test_populator_keeps_a_window_beyond_the_highest_block_used() -> None:
    kv = caches()
    populator = KvPopulator(kv)
    populator.ahead = 8  # a small window, so that the test sees it move
    populator.wanted = 8
    populator.start(lambda work: work())
    try:
        wait_for(lambda: populator.done >= 8)
        time.sleep(0.05)
        assert populator.done == 8  # no further than asked
        populator.reach(20)  # a step used block 20: blocks up to 28 are mapped next
        wait_for(lambda: populator.done >= 29)
        assert populator.done == 29
        for cache in kv:
            for half in cache:
                assert all_resident(half[:29])
        populator.reach(10_000)  # never past the cache
        wait_for(lambda: populator.done == 64)
    finally:
        populator.close()
    assert populator.thread is not None
    populator.thread.join(5)
    assert not populator.thread.is_alive()


def wait_for(condition, seconds: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the populating thread did not get there"
        time.sleep(0.01)
