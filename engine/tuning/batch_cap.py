"""Where a bigger decode batch stops paying: the rule that caps max_num_seqs from measured
decode throughput, and the cap that keeps a decode step within an ITL target.

A bigger decode batch pays while a step's fixed cost (weights read once, dispatch)
dominates, and stops paying once the per-sequence cost (attention over each context, the
sequence's share of the GEMMs) does: each step grows longer and every running request
waits through it. Left uncapped, paged batching grows its batch past that point and can
serve less than fixed batches. The cap is the first measured batch after which the next
one gains less than MIN_GAIN in tokens/s; where throughput still rises at the biggest
batch measured, the ceiling (the engine's default, or the user's flag) stays.

The rates come from `pagode plan --calibrate` (its fit's `decode_tok_s`, read by
planner/calibrate.py) or, with no calibration, from the decode steps the engine times at
its first start on a machine (engine/tuning/decode_rates.py). A calibration's rates are read
as measured, not from the fitted line: the fit is linear in the batch, while a GEMM can run
many more tokens per second at 256 rows than at 16, so the line puts the knee far too early.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MIN_GAIN = 0.10
# The smallest cap the knee gives. Below it, each step reads the weights for so few tokens
# that a bigger batch pays on any CPU; a knee that low is what a busy machine's timings
# show (other processes stretching the big steps), not the model's cost.
MIN_CAP = 16


@dataclass(frozen=True)
class BatchCap:
    max_num_seqs: int
    reason: str


def knee(rates: dict[int, float], ceiling: int, min_gain: float = MIN_GAIN) -> int | None:
    """The first batch that no bigger one beats by `min_gain` per doubling (compounded over
    the doublings between them); None where a bigger batch still pays. Comparing with every
    bigger batch, not only the next, steps over a plateau: where the fused decode step hands
    over to the GEMMs, one batch can gain little over the last and the next one much."""
    batches = sorted(b for b in rates if b <= ceiling)
    for i, small in enumerate(batches):
        bigger = batches[i + 1:]
        if bigger and all(rates[big] < (1 + min_gain) ** math.log2(big / small) * rates[small]
                          for big in bigger):
            return small
    return None


def from_step_seconds(seconds: dict[int, float], ceiling: int, context: int,
                      max_itl_ms: float | None = None) -> BatchCap:
    """The cap that decode steps timed at `context` positions give (batch -> seconds of one
    step): the knee of their throughput, and with an ITL target the biggest batch whose step
    fits it, whichever is smaller; at most `ceiling`."""
    rates = {b: b / t for b, t in seconds.items()}
    shown = ", ".join(f"{b}: {seconds[b] * 1e3:.0f} ms" for b in sorted(seconds))
    cap, why = ceiling, f"a bigger batch still gained >= {MIN_GAIN:.0%} decode tok/s per doubling"
    bend = knee(rates, ceiling)
    if bend is not None:
        cap, why = (max(bend, min(MIN_CAP, ceiling)),
                    f"no bigger batch gains >= {MIN_GAIN:.0%} decode tok/s per doubling")
        if bend < cap:
            why += f" after {bend}, but a cap stays >= {MIN_CAP}"
    if max_itl_ms is not None:
        fitting = [b for b, t in seconds.items() if t * 1e3 <= max_itl_ms and b <= cap]
        if not fitting:
            smallest = min(seconds)
            return BatchCap(smallest, f"--max-itl-ms {max_itl_ms:g}: even {smallest} decodes took "
                                      f"{seconds[smallest] * 1e3:.0f} ms at context {context}, so the "
                                      f"smallest batch measured ({shown})")
        if max(fitting) < cap:
            cap, why = max(fitting), f"the biggest batch whose step fits --max-itl-ms {max_itl_ms:g}"
    return BatchCap(cap, f"decode steps timed at context {context}: {why} ({shown})")


def from_decode_rates(measured: Mapping[str, Mapping[str, float]], source: str, default: int) -> BatchCap:
    """The cap that decode rates measured by a calibration give (context -> batch -> tok/s, as
    the fit keeps them, read from `source`): the knee at the longest context, at most `default`."""
    if not measured:
        return BatchCap(default, f"the default: the calibration at {source} has no decode rates "
                                 "(rerun `pagode plan --calibrate`)")
    context = max(measured, key=int)
    rates = {int(b): float(r) for b, r in measured[context].items()}
    shown = ", ".join(f"{b}: {r:.0f}" for b, r in sorted(rates.items()))
    cap = knee(rates, default)
    if cap is None:
        return BatchCap(default, f"the default: at context {context}, a bigger batch measured still gained "
                                 f">= {MIN_GAIN:.0%} decode tok/s per doubling ({shown}; {source})")
    return BatchCap(cap, f"measured at context {context}, no bigger batch gains >= {MIN_GAIN:.0%} "
                         f"decode tok/s per doubling ({shown}; {source})")
