"""Which kernel a quantized layer runs, by tokens per call: measured, not guessed.

At load, for each distinct weight shape and format, two races run on 1, 2, 4, ... tokens,
on one thread (engine/tuning/timing.py). First the block kernel's own two bodies, where the
library has the tile body (the amx build): the integer body keeps every count up to the
last one it wins, and the tile body takes the steps above (`tile_from`, kept on the weight,
which the layer path and the fused decode step both follow). Both read the same blocks, so
the race compares their arithmetic fairly even while the weight sits in cache. Then the
block kernel, so switched, against the dense GEMM: the kernel keeps every token count up to
the last one it wins before the GEMM wins twice in a row. Layers of the same shape share
the results for the life of the process, and later starts on the same machine read them
back (engine/tuning/race_memory.py). PAGODE_QUANT_TILES=N and PAGODE_QUANT_CROSSOVER=N pin them
instead (reproducible runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine import envs, native
from engine.quant.formats import Blocks, BlockWeights
from engine.tuning import race_memory, timing
from engine.tuning.timing import Crossover

log = logging.getLogger("pagode")

_cache: dict[tuple[str, int, int], Crossover] = {}
_tile_from: dict[tuple[str, int, int], int] = {}


def switch_to_tiles(blocks: Blocks, raced: Blocks | None = None) -> int:
    """Set, on every part of `blocks`, the fewest tokens per call from which the kernel's AMX
    tile body beats its integer body on this shape (0: never, or no tile body here); cached
    per (format, N, K). `raced`: the rows to time instead of all (first_rows)."""
    kernel = native.block_linear()
    key = shape_key(blocks)
    pinned = envs.QUANT_TILES.get()
    if kernel is None or not kernel.has_tile_body():
        _tile_from[key] = 0
    elif pinned is not None:
        _tile_from[key] = pinned
    elif key not in _tile_from:
        _tile_from[key] = race_tile_body(blocks if raced is None else raced, key)
    for part in blocks.parts:
        part.tile_from = _tile_from[key]
    return _tile_from[key]


def race_tile_body(blocks: Blocks, key: tuple[str, int, int]) -> int:
    remembered_as = ":".join(map(str, key))
    kept = race_memory.recall("tile-body", remembered_as)
    if kept is not None:
        return int(kept)
    kernel = native.block_linear()
    assert kernel is not None

    def time_bodies(m: int) -> tuple[float, float]:
        x = torch.randn(m, blocks.in_features)
        reps = 5 if m <= 16 else 2
        return (timing.best_time(lambda: kernel(x, blocks, tile_from=0), reps),
                timing.best_time(lambda: kernel(x, blocks, tile_from=1), reps))

    result = timing.crossover(timing.COUNTS, time_bodies, digits=4)
    tile_from = tile_switch(result)
    log.debug("tile body %s: from %d tokens, %s", key, tile_from, result.timings_ms)
    race_memory.keep("tile-body", remembered_as, tile_from)
    return tile_from


def tile_switch(race: Crossover) -> int:
    """The fewest tokens the tile body runs, from a race whose candidate was the integer body:
    every count past the integer body's last win (1: it never won; 0: it always did)."""
    return 0 if race.max_kernel_tokens >= timing.NO_LIMIT else race.max_kernel_tokens + 1


def shape_key(blocks: Blocks) -> tuple[str, int, int]:
    return "+".join(p.kind for p in blocks.parts), blocks.out_features, blocks.in_features


def first_rows(blocks: Blocks, rows: int) -> Blocks:
    """A tall weight's first `rows` rows, which its races time instead of the whole matrix
    (every row costs the same; an lm_head of 150k rows took seconds a race); the weight
    itself where it is not taller, or its rows lie in several parts."""
    if not isinstance(blocks, BlockWeights) or blocks.out_features <= rows:
        return blocks
    mins = None if blocks.mins is None else blocks.mins[:rows]
    return BlockWeights(blocks.kind, blocks.qs[:rows], blocks.scales[:rows], mins, rows, blocks.in_features)


def measure(blocks: Blocks, gemm: Callable[[torch.Tensor], torch.Tensor], raced: Blocks | None = None) -> Crossover:
    """Time both kernels on this layer's shape; cached per (format, N, K). `raced`: the rows
    to time instead of all (first_rows), `gemm` then built on the same rows."""
    key = shape_key(blocks)
    blocks = blocks if raced is None else raced
    found = known(key)
    if found is not None:
        return found
    result = timing.crossover(timing.COUNTS, lambda m: time_layer(blocks, gemm, m), digits=4)
    log.debug("crossover %s: kernel up to %d tokens, %s", key, result.max_kernel_tokens, result.timings_ms)
    race_memory.keep("block-kernel", ":".join(map(str, key)), result.max_kernel_tokens)
    _cache[key] = result
    return result


def known(key: tuple[str, int, int]) -> Crossover | None:
    """The crossover of this shape where no race is needed (measured in this process, pinned,
    or remembered from an earlier start), so that a layer builds its GEMM only if it keeps it."""
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
    return None


def time_layer(blocks: Blocks, gemm: Callable[[torch.Tensor], torch.Tensor], m: int) -> tuple[float, float]:
    """Seconds of (block kernel, GEMM) on m random tokens, best of a few runs."""
    kernel = native.block_linear()
    assert kernel is not None, "the block-quantized kernel is not available"
    x = torch.randn(m, blocks.in_features)
    reps = 5 if m <= 16 else 2
    return timing.best_time(lambda: kernel(x, blocks), reps), timing.best_time(lambda: gemm(x), reps)


def cached() -> dict[tuple[str, int, int], Crossover]:
    return dict(_cache)
