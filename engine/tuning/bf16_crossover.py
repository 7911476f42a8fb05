"""Up to how many tokens a bf16 layer runs pagode's AMX GEMM instead of oneDNN's: measured.

Both read the same bf16 weight (engine/quant/bf16_gemm.py). At tens of tokens a step is a
read of the weights, which the AMX kernel (cpu_kernels/src/bf16_gemm.cpp) streams at close
to the memory's rate and oneDNN's GEMM on a plain weight does not; at hundreds of tokens the
products dominate and oneDNN's blocking wins. Where they cross depends on the CPU and the
shape, so at load each distinct shape races the two on its first RACE_ROWS rows at COUNTS
tokens, one thread (timing.crossover: the kernel keeps every count up to its last win before
two losses in a row), and later starts on the same machine read the result back
(race_memory.py). PAGODE_BF16_KERNEL=0 keeps oneDNN at every size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine import envs, native
from engine.tuning import race_memory, timing

log = logging.getLogger("pagode")

RACE = "bf16-kernel"  # race_memory's name for these results
COUNTS = (16, 32, 64, 128, 256, 512)
RACE_ROWS = 4096  # every row costs the same: a taller weight is raced on its first rows

_limits: dict[tuple[int, int], int] = {}  # (rows raced, K) -> the kernel's largest step
Timer = Callable[[torch.Tensor, int], tuple[float, float]]  # (weight rows, m tokens) -> (kernel, oneDNN) seconds


def limit(weight: torch.Tensor, time_both: Timer) -> int:
    """The most tokens per call the AMX kernel takes on this bf16 weight [N, K] (0: never);
    `time_both(rows, m)` times (kernel, oneDNN) on `rows` at m tokens."""
    kernel = native.bf16_gemm()
    if not envs.BF16_KERNEL.get() or kernel is None or not kernel.fits(weight):
        return 0
    key = (min(weight.shape[0], RACE_ROWS), weight.shape[1])
    if key not in _limits:
        _limits[key] = race(weight[:key[0]], key, time_both)
    return _limits[key]


def race(rows: torch.Tensor, key: tuple[int, int], time_both: Timer) -> int:
    remembered_as = ":".join(map(str, key))
    kept = race_memory.recall(RACE, remembered_as)
    if kept is not None:
        return int(kept)
    result = timing.crossover(COUNTS, lambda m: time_both(rows, m), digits=3)
    log.debug("bf16 kernel %dx%d: up to %d tokens, %s", *key, result.max_kernel_tokens, result.timings_ms)
    race_memory.keep(RACE, remembered_as, result.max_kernel_tokens)
    return result.max_kernel_tokens
