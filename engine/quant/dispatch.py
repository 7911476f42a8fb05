"""The block kernel's timings for the load-time races of engine/tuning/kernel_crossover.py, and
setting their results on a layer's blocks.

For each distinct weight shape and format the races time, on random tokens, first the
block kernel's own two bodies where the library has the tile body (the amx build), then the
block kernel, so switched, against the layer's dense GEMM. Both bodies read the same
blocks, so the race compares their arithmetic fairly even while the weight sits in cache.
The tile body's start (`tile_from`) is kept on the weight, which the layer path and the
fused decode step both follow.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine import envs, native
from engine.quant.formats import Blocks, BlockWeights
from engine.tuning import kernel_crossover
from engine.tuning.timing import Crossover, best_time


def switch_to_tiles(blocks: Blocks, raced: Blocks | None = None) -> int:
    """Set, on every part of `blocks`, the fewest tokens per call from which the kernel's AMX
    tile body beats its integer body on this shape (0: never, or no tile body here); cached
    per (format, N, K). `raced`: the rows to time instead of all (first_rows)."""
    kernel = native.block_linear()
    timed = blocks if raced is None else raced

    def time_bodies(m: int) -> tuple[float, float]:
        assert kernel is not None
        x = torch.randn(m, timed.in_features)
        reps = 5 if m <= 16 else 2
        return (best_time(lambda: kernel(x, timed, tile_from=0), reps),
                best_time(lambda: kernel(x, timed, tile_from=1), reps))

    tile_from = kernel_crossover.tile_from(shape_key(blocks), kernel is not None and kernel.has_tile_body(),
                                       time_bodies)
    for part in blocks.parts:
        part.tile_from = tile_from
    return tile_from


def shape_key(blocks: Blocks) -> tuple[str, int, int]:
    """(formats, N, K), the formats marked where the tile body takes int8 tokens: that kernel
    is raced against the GEMM apart from the exact one."""
    kinds = "+".join(p.kind for p in blocks.parts)
    return kinds + ("/int8" if blocks.parts[0].int8_tokens else ""), blocks.out_features, blocks.in_features


def int8_tokens_allowed() -> bool:
    """The tile body may take int8 tokens (PAGODE_TILE_INT8, and bf16 tokens not asked for)."""
    return envs.TILE_INT8.get() and not envs.TILE_BF16.get()


def first_rows(blocks: Blocks, rows: int) -> Blocks:
    """A tall weight's first `rows` rows, which its races time instead of the whole matrix
    (every row costs the same; an lm_head of 150k rows took seconds a race); the weight
    itself where it is not taller, or its rows lie in several parts."""
    if not isinstance(blocks, BlockWeights) or blocks.out_features <= rows:
        return blocks
    mins = None if blocks.mins is None else blocks.mins[:rows]
    return BlockWeights(blocks.kind, blocks.qs[:rows], blocks.scales[:rows], mins, rows, blocks.in_features,
                        blocks.tile_from, blocks.int8_tokens)


def measure(blocks: Blocks, gemm: Callable[[torch.Tensor], torch.Tensor], raced: Blocks | None = None) -> Crossover:
    """Up to how many tokens the block kernel beats `gemm` on this layer's shape; cached per
    (format, N, K). `raced`: the rows to time instead of all (first_rows), `gemm` then built
    on the same rows."""
    timed = blocks if raced is None else raced
    return kernel_crossover.measure(shape_key(blocks), lambda m: time_layer(timed, gemm, m))


def time_layer(blocks: Blocks, gemm: Callable[[torch.Tensor], torch.Tensor], m: int) -> tuple[float, float]:
    """Seconds of (block kernel, GEMM) on m random tokens, best of a few runs."""
    kernel = native.block_linear()
    assert kernel is not None, "the block-quantized kernel is not available"
    x = torch.randn(m, blocks.in_features)
    reps = 5 if m <= 16 else 2
    return best_time(lambda: kernel(x, blocks), reps), best_time(lambda: gemm(x), reps)
