"""How long a decode step takes on this machine at a few batch sizes, on synthetic steps.

Why: a bigger decode batch pays while a step's fixed cost (weights read once, dispatch)
dominates, and stops paying once the per-sequence cost (attention over each context, the
sequence's share of the GEMMs) does. `pagode serve` sizes its batch from these times
(engine/tuning/batch_cap.py) at the first start on a machine, with no manual step: each batch
size runs whole decode steps (the fused C++ step where it applies, the lm_head included)
at one context length, best of two, and the times are kept with the load-time races
(engine/tuning/race_memory.py), so later starts read them back.

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

from engine.config import EngineConfig, dtype_name
from engine.model import decode_step
from engine.runner.kv_cache import touch_blocks
from engine.runner.model_runner import ModelRunner, StepInputs
from engine.tuning import race_memory, timing
from engine.tuning.batch_cap import BatchCap, from_step_seconds
from engine.tuning.timing import plausible

log = logging.getLogger("pagode")

BATCHES = (1, 8, 16, 32, 64, 128, 192, 256)  # up to the engine's default cap
CONTEXT = 192  # positions per sequence: a chat turn's, and where attention's share shows
REPS = 2


def size_batch(runner: ModelRunner, config: EngineConfig, model_name: str) -> BatchCap:
    """Set config.max_num_seqs (read by the scheduler at every step) from this machine's
    decode steps; the CPU only, where the step's cost is what this measures."""
    if runner.device.type != "cpu":
        cap = BatchCap(config.max_num_seqs, "the default: decode steps are timed at load on the CPU only")
    else:
        key = ":".join((model_name, config.quantization, dtype_name(runner.dtype),
                        dtype_name(runner.kv_dtype), runner.backend.name))
        cap = from_step_seconds(decode_step_seconds(runner, key, resident_batches(runner, CONTEXT)),
                                config.max_num_seqs, CONTEXT, config.max_itl_ms)
    config.max_num_seqs = cap.max_num_seqs
    log.info("max_num_seqs %d: %s", cap.max_num_seqs, cap.reason)
    return cap


def decode_step_seconds(runner: ModelRunner, key: str, batches: tuple[int, ...] = BATCHES,
                        context: int = CONTEXT) -> dict[int, float]:
    """batch -> seconds of one decode step of that many sequences at `context` positions;
    read back from an earlier start on this machine where `key` (the model and its dtypes)
    was measured."""
    race_key = f"{key}:{context}:{','.join(map(str, batches))}"
    kept = race_memory.recall("decode-step-seconds", race_key)
    if kept is not None:
        return {int(b): float(t) for b, t in kept.items()}
    touch_blocks(runner.kv_caches, max(batches) * blocks_per_sequence(runner, context))
    times = {b: step_seconds(runner, synthetic_decodes(runner, b, context)) for b in batches}
    if plausible(times):
        race_memory.keep("decode-step-seconds", race_key, {str(b): t for b, t in times.items()})
    else:
        log.warning("decode steps timed at load look like a busy machine's (no batch ran at twice one "
                    "sequence's tok/s: %s); not kept, so the next start times them again",
                    {b: round(t * 1e3, 1) for b, t in times.items()})
    return times


def resident_batches(runner: ModelRunner, context: int) -> tuple[int, ...]:
    """The BATCHES whose sequences all fit the KV cache at `context` positions (the two
    smallest at least)."""
    fit = runner.num_blocks // blocks_per_sequence(runner, context)
    chosen = tuple(b for b in BATCHES if b <= fit)
    return chosen if len(chosen) >= 2 else BATCHES[:2]


def step_seconds(runner: ModelRunner, inputs: StepInputs) -> float:
    """Seconds of one whole step (runner.forward: the fused step where it applies, the logits),
    best of REPS. No warm-up call is set apart: a batch size's first step takes within a few
    percent of the next ones (its GEMMs' first call at a new size costs little next to a
    whole step), and the best of the runs drops it where it is slower. A warm-up would be a
    third of this measurement, and of a first start's."""
    return timing.best_time(lambda: runner.forward(inputs), REPS, warm_up=False)


def blocks_per_sequence(runner: ModelRunner, context: int) -> int:
    return -(-context // runner.block_size)


def synthetic_decodes(runner: ModelRunner, batch: int, context: int) -> StepInputs:
    """`batch` decodes, each at position `context - 1` of its own run of blocks."""
    ids, positions, meta = decode_step.synthetic_decodes(batch, runner.block_size, runner.model_config.vocab_size,
                                                         context, runner.num_blocks)
    return StepInputs(ids, positions, meta, list(range(batch)), list(range(batch + 1)))
