"""How long a decode step takes on this machine at a few batch sizes, on synthetic steps.

Why: a bigger decode batch pays while a step's fixed cost (weights read once, dispatch)
dominates, and stops paying once the per-sequence cost (attention over each context, the
sequence's share of the GEMMs) does. `pagode serve` sizes its batch from these times
(batch_cap.py) at the first start on a machine, with no manual step: each batch size runs
whole decode steps (the fused C++ step where it applies, the lm_head included) at one
context length, best of two, and the times are kept with the load-time races
(race_memory.py), so later starts read them back.

The steps read and write real cache blocks: the blocks they use are filled first, because
untouched pages of a lazily zeroed cache all map to one shared zero page, which would
make attention look nearly free. Only the batches whose sequences all fit the cache at
that context are timed: a bigger one never runs at that context, and its sequences would
share blocks that stay in the CPU's cache, pricing attention too low (and timing the
biggest ones was most of what a first start spent here on a model whose cache holds a few
dozen such sequences). Where even two sizes do not fit, the two smallest run on shared
blocks. What the steps write is overwritten before any request reads it, as the
fused-step race's is.
"""

from __future__ import annotations

import logging

from engine.tuning import race_memory, timing
from engine.tuning.batch_cap import BatchCap, from_step_seconds
from engine.tuning.steps import SyntheticSteps
from engine.tuning.timing import plausible

log = logging.getLogger("pagode")

BATCHES = (1, 8, 16, 32, 64, 128, 192, 256)  # up to the engine's default cap
CONTEXT = 192  # positions per sequence: a chat turn's, and where attention's share shows
REPS = 2


def size_batch(steps: SyntheticSteps, ceiling: int, max_itl_ms: float | None) -> BatchCap:
    """max_num_seqs from this machine's decode steps, at most `ceiling`; the CPU only, where
    the step's cost is what this measures."""
    if steps.device_type != "cpu":
        return BatchCap(ceiling, "the default: decode steps are timed at load on the CPU only")
    return from_step_seconds(decode_step_seconds(steps, resident_batches(steps, CONTEXT)), ceiling, CONTEXT,
                             max_itl_ms)


def decode_step_seconds(steps: SyntheticSteps, batches: tuple[int, ...] = BATCHES,
                        context: int = CONTEXT) -> dict[int, float]:
    """batch -> seconds of one decode step of that many sequences at `context` positions;
    read back from an earlier start on this machine where the same model and dtypes
    (steps.rates_key) were measured."""
    race_key = f"{steps.rates_key}:{context}:{','.join(map(str, batches))}"
    kept = race_memory.recall("decode-step-seconds", race_key)
    if kept is not None:
        return {int(b): float(t) for b, t in kept.items()}
    steps.fill(max(batches) * blocks_per_sequence(steps.block_size, context))
    times = {b: step_seconds(steps, b, context) for b in batches}
    if plausible(times):
        race_memory.keep("decode-step-seconds", race_key, {str(b): t for b, t in times.items()})
    else:
        log.warning("decode steps timed at load look like a busy machine's (no batch ran at twice one "
                    "sequence's tok/s: %s); not kept, so the next start times them again",
                    {b: round(t * 1e3, 1) for b, t in times.items()})
    return times


def resident_batches(steps: SyntheticSteps, context: int) -> tuple[int, ...]:
    """The BATCHES whose sequences all fit the KV cache at `context` positions (the two
    smallest at least)."""
    fit = steps.num_blocks // blocks_per_sequence(steps.block_size, context)
    chosen = tuple(b for b in BATCHES if b <= fit)
    return chosen if len(chosen) >= 2 else BATCHES[:2]


def step_seconds(steps: SyntheticSteps, batch: int, context: int) -> float:
    """Seconds of one whole step of `batch` decodes (the fused step where it applies, the
    logits), best of REPS. No warm-up call is set apart: a batch size's first step takes
    within a few percent of the next ones (its GEMMs' first call at a new size costs little
    next to a whole step), and the best of the runs drops it where it is slower. A warm-up
    would be a third of this measurement, and of a first start's."""
    return timing.best_time(steps.forward(batch, context), REPS, warm_up=False)


def blocks_per_sequence(block_size: int, context: int) -> int:
    return -(-context // block_size)
