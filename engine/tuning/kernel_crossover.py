"""Which kernel a quantized layer runs, by tokens per call: measured, not guessed.

At load, for each distinct weight shape and format, two races run on 1, 2, 4, ... tokens,
on one thread (timing.py); engine/quant/dispatch.py times the kernels for them. First the
block kernel's own two bodies, where the library has the tile body (the amx build): the
integer body keeps every count up to the last one it wins, and the tile body takes the
steps above (`tile_from`). Then the block kernel, so switched, against the dense GEMM: the
kernel keeps every token count up to the last one it wins before the GEMM wins twice in a
row. Layers of the same shape share the results for the life of the process, and later
starts on the same machine read them back (race_memory.py). PAGODE_QUANT_TILES=N and
PAGODE_QUANT_CROSSOVER=N pin them instead (reproducible runs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine import envs
from engine.tuning import race_memory, timing
from engine.tuning.timing import Crossover

log = logging.getLogger("pagode")

BLOCK_KERNEL = "block-kernel"  # race_memory's names of the two races
TILE_BODY = "tile-body"

Key = tuple[str, int, int]  # the format(s) of the weight's parts, N, K
Timer = Callable[[int], tuple[float, float]]  # m tokens -> seconds of (candidate, incumbent)

_cache: dict[Key, Crossover] = {}
_tile_from: dict[Key, int] = {}


def tile_from(key: Key, has_tile_body: bool, time_bodies: Timer) -> int:
    """The fewest tokens per call from which the kernel's AMX tile body beats its integer body
    on this shape (0: never, or no tile body here); `time_bodies(m)` times (integer, tile)."""
    pinned = envs.QUANT_TILES.get()
    if not has_tile_body:
        _tile_from[key] = 0
    elif pinned is not None:
        _tile_from[key] = pinned
    elif key not in _tile_from:
        _tile_from[key] = race_tile_body(key, time_bodies)
    return _tile_from[key]


def race_tile_body(key: Key, time_bodies: Timer) -> int:
    remembered_as = ":".join(map(str, key))
    kept = race_memory.recall(TILE_BODY, remembered_as)
    if kept is not None:
        return int(kept)
    result = timing.crossover(timing.COUNTS, time_bodies, digits=4)
    switch = tile_switch(result)
    log.debug("tile body %s: from %d tokens, %s", key, switch, result.timings_ms)
    race_memory.keep(TILE_BODY, remembered_as, switch)
    return switch


def tile_switch(race: Crossover) -> int:
    """The fewest tokens the tile body runs, from a race whose candidate was the integer body:
    every count past the integer body's last win (1: it never won; 0: it always did)."""
    return 0 if race.max_kernel_tokens >= timing.NO_LIMIT else race.max_kernel_tokens + 1


def measure(key: Key, time_both: Timer) -> Crossover:
    """Up to how many tokens the block kernel beats the GEMM on this shape, `time_both(m)`
    timing (kernel, GEMM); cached per (format, N, K)."""
    found = known(key)
    if found is not None:
        return found
    result = timing.crossover(timing.COUNTS, time_both, digits=4)
    log.debug("crossover %s: kernel up to %d tokens, %s", key, result.max_kernel_tokens, result.timings_ms)
    race_memory.keep(BLOCK_KERNEL, ":".join(map(str, key)), result.max_kernel_tokens)
    _cache[key] = result
    return result


def known(key: Key) -> Crossover | None:
    """The crossover of this shape where no race is needed (measured in this process, pinned,
    or remembered from an earlier start), so that a layer builds its GEMM only if it keeps it."""
    if key in _cache:
        return _cache[key]
    pinned = envs.QUANT_CROSSOVER.get()
    if pinned is not None:
        _cache[key] = Crossover(int(pinned))
        return _cache[key]
    kept = race_memory.recall(BLOCK_KERNEL, ":".join(map(str, key)))
    if kept is not None:
        _cache[key] = Crossover(int(kept))
        return _cache[key]
    return None


def cached() -> dict[Key, Crossover]:
    return dict(_cache)
