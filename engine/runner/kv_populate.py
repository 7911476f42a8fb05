"""Fault in the CPU KV cache's pages ahead of the blocks the engine hands out.

The cache is lazily zeroed (kv_cache.lazily_zeroed): its pages are mapped when a step first
writes them, so a start does not wait for gigabytes of memset. But on a virtual machine a
first touch can cost far more than the write: each fault may also go to the host, and on
the 2-core VMs pagode is measured on, a 512-token chunk's K/V write into fresh pages took
several milliseconds per layer against half a millisecond into mapped ones. A thread at the
lowest CPU priority (it runs when a core would idle, e.g. while a step's Python runs on the
other) keeps a window of blocks beyond the highest one any step has used mapped, with
Linux's MADV_POPULATE_WRITE: it maps pages writable without writing them, so it is safe
beside steps that write the same blocks. Blocks are handed out in ascending order until
each has been used once (engine/core/block_manager.py), so the window covers the next ones.
Elsewhere (another OS, Linux before 5.14) the advice fails and the thread stops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading
from collections.abc import Callable
from typing import cast

import torch

MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14+
PAGE = 4096
AHEAD_BYTES = 256 << 20  # the window beyond the highest used block, all layers together
MAX_AHEAD_BLOCKS = 512
CHUNK_BLOCKS = 16  # blocks per call: small, so that close() and new targets are seen soon


def populate(address: int, nbytes: int) -> bool:
    """Map [address, address + nbytes) writable, contents unchanged; True when Linux did."""
    if not sys.platform.startswith("linux") or nbytes <= 0:
        return False
    start = address // PAGE * PAGE
    return madvise()(start, address + nbytes - start, MADV_POPULATE_WRITE) == 0


@functools.cache
def madvise() -> Callable[[int, int, int], int]:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return cast(Callable[[int, int, int], int], libc.madvise)


class KvPopulator:
    """Keeps blocks [0, highest used + window) of every layer's cache mapped, from a thread."""

    def __init__(self, kv_caches: list[torch.Tensor]) -> None:
        self.caches = kv_caches  # [2, blocks, ...] each, contiguous
        self.num_blocks = kv_caches[0].shape[1]
        block_bytes = kv_caches[0][0, 0].numel() * kv_caches[0].element_size()
        self.block_bytes = block_bytes
        self.ahead = max(1, min(MAX_AHEAD_BLOCKS, AHEAD_BYTES // (2 * block_bytes * len(kv_caches))))
        self.done = 0  # blocks [0, done) are mapped
        self.wanted = min(self.ahead, self.num_blocks)
        self._wake = threading.Condition()
        self._stopped = False
        self.thread: threading.Thread | None = None

    def start(self, run_in: Callable[[Callable[[], None]], None]) -> None:
        """Start the thread; `run_in(work)` runs work at the priority it chooses."""
        self.thread = threading.Thread(target=run_in, args=(self._run,), name="pagode-kv-populate", daemon=True)
        self.thread.start()

    def reach(self, highest_block: int) -> None:
        """A step uses blocks up to `highest_block`: keep the window beyond it mapped."""
        wanted = min(self.num_blocks, highest_block + 1 + self.ahead)
        if wanted > self.wanted:
            with self._wake:
                self.wanted = wanted
                self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and self.done >= self.wanted:
                    self._wake.wait()
                if self._stopped:
                    return
                first, last = self.done, min(self.wanted, self.done + CHUNK_BLOCKS)
            if not self._populate(first, last):
                return
            self.done = last

    def _populate(self, first: int, last: int) -> bool:
        offset, nbytes = first * self.block_bytes, (last - first) * self.block_bytes
        return all(populate(cache[kv].data_ptr() + offset, nbytes) for cache in self.caches for kv in (0, 1))
