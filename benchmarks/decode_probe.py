"""A synthetic decode step on the real model and cache, for timing the bare forward.

`held_decode_batch` gives `batch` sequences of `context` random tokens real KV blocks (from
the engine's own block manager) and a step that decodes one token of each; the runner's
`prepare` and `forward` run it with no scheduler, sampler or detokenizer around them. The
blocks go back when the `with` block ends.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

from engine.core.scheduler import ScheduledSeq
from engine.core.sequence import Sequence
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from engine.types.outputs import RequestTimes


@contextmanager
def held_decode_batch(llm: LLM, batch: int, context: int) -> Iterator[list[ScheduledSeq]]:
    """A decode step of `batch` sequences of `context` random tokens, holding real blocks."""
    blocks = llm.engine.block_manager
    scheduled = []
    try:
        for i in range(batch):
            seq = Sequence(f"probe-{i}", [random.randrange(1000, 9000) for _ in range(context)],
                           SamplingParams(), RequestTimes(0.0))
            blocks.allocate(seq, context)
            seq.num_computed_tokens = context - 1
            scheduled.append(ScheduledSeq(seq, 1))
        yield scheduled
    finally:
        for s in scheduled:
            blocks.free(s.seq)


def forward_seconds(llm: LLM, scheduled: list[ScheduledSeq], reps: int, warm_up: int = 2) -> float:
    """Mean seconds of packing + model + logits for this step, after `warm_up` untimed runs
    (the BLAS picks its kernels for the shape)."""
    runner = llm.engine.runner
    for _ in range(warm_up):
        runner.forward(runner.prepare(scheduled))
    start = time.perf_counter()
    for _ in range(reps):
        runner.forward(runner.prepare(scheduled))
    return (time.perf_counter() - start) / reps


def bare_forward_rate(llm: LLM, batch: int, seq_len: int, reps: int) -> float:
    """Decode tokens per second of packing + model + logits alone, at this shape."""
    with held_decode_batch(llm, batch, seq_len) as scheduled:
        return batch / forward_seconds(llm, scheduled, reps)
