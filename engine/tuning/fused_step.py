"""Up to how many decodes the fused C++ decode step beats the layer-by-layer path: raced at load.

Both paths run synthetic decode steps of 1, 2, 4, ... sequences on the engine's threads
(model/decode_step.py makes them), and the fused step keeps every count up to its last win
before the layer-by-layer path (whose big projections move to their dense GEMM) wins twice
in a row (timing.crossover). The limit is cached per model shape, and read back at later
starts on the same machine (race_memory.py).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.tuning import race_memory, timing
from engine.tuning.timing import Crossover

RACE = "fused-decode-step"  # race_memory's name for these results

_limits: dict[str, Crossover] = {}
# The biggest decode step the race times. Past it a step is long enough that the fused
# step's one call saves little, and its two biggest counts were half of a first start's
# race: a step of more decodes runs layer by layer, whatever the fused step won below.
RACE_MAX_DECODES = 64


def measure_limit(key: str, max_decodes: int, num_blocks: int,
                  time_both: Callable[[int], tuple[float, float]]) -> Crossover:
    """The fused step's limit for the model shape `key`: raced with `time_both(m)` (seconds of
    a step of m decodes, fused and layer by layer) on at most `max_decodes` and `num_blocks`
    sequences, or read back."""
    if key in _limits:
        return _limits[key]
    kept = race_memory.recall(RACE, key)
    if kept is not None:
        _limits[key] = Crossover(int(kept["limit"]), {int(m): (t[0], t[1]) for m, t in kept["ms"].items()})
        return _limits[key]
    counts = [m for m in timing.COUNTS if m <= min(max_decodes, num_blocks, RACE_MAX_DECODES)]
    result = timing.crossover(counts, time_both, digits=2, threads=None)
    if result.max_kernel_tokens >= timing.NO_LIMIT and min(max_decodes, num_blocks) > RACE_MAX_DECODES:
        result.max_kernel_tokens = max(counts)  # bigger steps were not raced: layer by layer
    race_memory.keep(RACE, key, {"limit": result.max_kernel_tokens, "ms": result.timings_ms})
    _limits[key] = result
    return result
