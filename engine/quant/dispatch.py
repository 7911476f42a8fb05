"""Which kernel a quantized layer runs, by tokens per call: measured, not guessed.

At load, for each distinct weight shape and format, the block kernel and the dense GEMM are
timed on 1, 2, 4, ... tokens, best of a few runs, on one thread: the ratio is what matters
and both scale alike over threads, while a busy machine's scheduler makes two-thread timings
of a 50-microsecond call worthless. The block kernel keeps every token count up to the last
one it wins before the GEMM wins twice in a row. Layers of the same shape share the result
for the life of the process. PAGODE_QUANT_CROSSOVER=N pins it instead (reproducible runs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from engine import envs, native
from engine.quant.formats import BlockWeights

log = logging.getLogger("pagode")

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NO_LIMIT = 1 << 30


@dataclass
class Crossover:
    max_kernel_tokens: int  # the block kernel runs calls of up to this many tokens; the GEMM above
    timings_ms: dict[int, tuple[float, float]] = field(default_factory=dict)  # tokens -> (kernel, gemm)

    def decide(self) -> None:
        """The largest token count the kernel wins before the GEMM wins twice in a row."""
        self.max_kernel_tokens, losses = 0, 0
        for m in sorted(self.timings_ms):
            kernel, gemm = self.timings_ms[m]
            if kernel <= gemm:
                self.max_kernel_tokens, losses = m, 0
            else:
                losses += 1
                if losses == 2:
                    return
        if losses == 0 and self.timings_ms:
            self.max_kernel_tokens = NO_LIMIT  # the kernel won everywhere measured


_cache: dict[tuple[str, int, int], Crossover] = {}


def best_time(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(blocks: BlockWeights, gemm: Callable[[torch.Tensor], torch.Tensor]) -> Crossover:
    """Time both kernels on this layer's shape; cached per (format, N, K)."""
    key = (blocks.kind, blocks.out_features, blocks.in_features)
    if key in _cache:
        return _cache[key]
    pinned = envs.QUANT_CROSSOVER.get()
    if pinned is not None:
        _cache[key] = Crossover(int(pinned))
        return _cache[key]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            result = race(TOKEN_COUNTS, lambda m: time_layer(blocks, gemm, m), digits=4)
    finally:
        torch.set_num_threads(threads)
    log.debug("crossover %s: kernel up to %d tokens, %s", key, result.max_kernel_tokens, result.timings_ms)
    _cache[key] = result
    return result


def time_layer(blocks: BlockWeights, gemm: Callable[[torch.Tensor], torch.Tensor], m: int) -> tuple[float, float]:
    """Seconds of (block kernel, GEMM) on m random tokens, best of a few runs."""
    kernel = native.block_linear()
    assert kernel is not None, "the block-quantized kernel is not available"
    x = torch.randn(m, blocks.in_features)
    reps = 5 if m <= 16 else 2
    return best_time(lambda: kernel(x, blocks), reps), best_time(lambda: gemm(x), reps)


def race(counts: Iterable[int], time_both: Callable[[int], tuple[float, float]], digits: int) -> Crossover:
    """Time (candidate, incumbent) in seconds at each count, in order, until the incumbent wins
    twice in a row; the candidate keeps every count up to its last win (Crossover.decide)."""
    result = Crossover(0)
    losses = 0
    for m in counts:
        mine, theirs = time_both(m)
        result.timings_ms[m] = (round(mine * 1e3, digits), round(theirs * 1e3, digits))
        losses = losses + 1 if mine > theirs else 0
        if losses == 2:
            break
    result.decide()
    return result


def cached() -> dict[tuple[str, int, int], Crossover]:
    return dict(_cache)
