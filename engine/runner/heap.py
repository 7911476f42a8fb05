"""Keep a step's freed memory in the process's heap for the next step (glibc only).

A prefill's tensors are tens of MB each (a 1,000-token chunk's gate-up output is 48 MB in
fp32). glibc serves each allocation over its mmap threshold (32 MiB at most) with a fresh
mapping and unmaps it on free, so every step faults in every page of every big tensor again,
and the kernel zeroes each page first: a cast or a copy of such a tensor ran at a few GB/s,
several times slower than into memory already mapped. Once the weights and the KV cache are
allocated (they keep their own mappings), pagode tells glibc to serve big blocks from the
heap (M_MMAP_MAX 0) and not to give the heap's top back (M_TRIM_THRESHOLD), so each step
reuses the pages the previous one freed. The heap then holds up to the biggest step's
working set, which the next such step needs again anyway. PAGODE_HEAP_KEEP=0 leaves glibc's
defaults; other C libraries have no mallopt and are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

from engine import envs

log = logging.getLogger("pagode")

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h> parameter numbers
M_MMAP_MAX = -4
TRIM_NEVER = 2**31 - 1  # mallopt takes an int: the largest threshold it can say


def keep_freed_memory() -> bool:
    """Switch glibc's allocator to reuse freed big blocks; True when it took the settings.
    Process-wide and idempotent."""
    if not envs.HEAP_KEEP.get():
        return False
    libc = glibc()
    if libc is None:
        return False
    kept = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_NEVER) == 1
    if not kept:
        log.warning("glibc refused the allocator settings; big tensors are mapped afresh each step")
    return kept


def glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    # musl and others have no gnu_get_libc_version (nor glibc's mallopt parameters).
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None
