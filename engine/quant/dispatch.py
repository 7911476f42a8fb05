"""Which kernel a quantized layer runs, by tokens per call: measured, not guessed.

At load, for each distinct weight shape and format, the block kernel and the dense GEMM are
raced (engine/autotune.py) on 1, 2, 4, ... tokens, on one thread. The block kernel keeps
every token count up to the last one it wins before the GEMM wins twice in a row. Layers of
the same shape share the result for the life of the process, and later starts on the same
machine read it back (engine/race_memory.py). PAGODE_QUANT_CROSSOVER=N pins it instead
(reproducible runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine import autotune, envs, native, race_memory
from engine.autotune import Crossover
from engine.quant.formats import Blocks

log = logging.getLogger("pagode")

_cache: dict[tuple[str, int, int], Crossover] = {}


def measure(blocks: Blocks, gemm: Callable[[torch.Tensor], torch.Tensor]) -> Crossover:
    """Time both kernels on this layer's shape; cached per (format, N, K)."""
    key = ("+".join(p.kind for p in blocks.parts), blocks.out_features, blocks.in_features)
    if key in _cache:
        return _cache[key]
    pinned = envs.QUANT_CROSSOVER.get()
    if pinned is not None:
        _cache[key] = Crossover(int(pinned))
        return _cache[key]
    kept = race_memory.recall("block-kernel", ":".join(map(str, key)))
    if kept is not None:
        _cache[key] = Crossover(int(kept))
        return _cache[key]
    result = autotune.crossover(autotune.COUNTS, lambda m: time_layer(blocks, gemm, m), digits=4)
    log.debug("crossover %s: kernel up to %d tokens, %s", key, result.max_kernel_tokens, result.timings_ms)
    race_memory.keep("block-kernel", ":".join(map(str, key)), result.max_kernel_tokens)
    _cache[key] = result
    return result


def time_layer(blocks: Blocks, gemm: Callable[[torch.Tensor], torch.Tensor], m: int) -> tuple[float, float]:
    """Seconds of (block kernel, GEMM) on m random tokens, best of a few runs."""
    kernel = native.block_linear()
    assert kernel is not None, "the block-quantized kernel is not available"
    x = torch.randn(m, blocks.in_features)
    reps = 5 if m <= 16 else 2
    return autotune.best_time(lambda: kernel(x, blocks), reps), autotune.best_time(lambda: gemm(x), reps)


def cached() -> dict[tuple[str, int, int], Crossover]:
    return dict(_cache)
