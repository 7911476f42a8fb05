"""What a forward pass costs by its token count, measured at start-up, for the draft switch.

A draft of d tokens makes the step d tokens bigger. While a pass is bound by reading the
weights that is nearly free; once the step carries enough tokens to be compute bound, each
draft token costs about what a real token does, and a draft that is not wholly accepted
loses throughput. The drafter weighs every draft against this curve (engine/spec/drafter.py),
so the point where drafting stops is this machine's, not a constant.

The curve is timed on decode-shaped steps (m sequences of one token each at CONTEXT
positions, logits for every row, as verification needs), on the engine's threads, best of
a few runs. On the CPU a drafted sequence's positions run as decode rows of exactly this
shape (ModelRunner.prepare), so a draft token costs what a decode does.

Two curves: the layer-by-layer (general) path, and the fused C++ decode step of
block-quantized CPU models, which takes any step of decodes and drafts up to its limit.
`step` prices a step on the one it would run on, so a draft that keeps a decode-only step
within the fused limit is priced on the fused curve, and one that pushes it past pays for
leaving it.

Timing the curves is a share of a speculating engine's start, and they answer the same on
the same machine: they are kept with the load-time races (race_memory.py), per model
shape, weights and cache dtype, and read back at later starts; engines built alike in one
process measure once. The steps are the runner's own (steps.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from engine.tuning import race_memory, timing
from engine.tuning.steps import SyntheticSteps

REPS = 2  # timed runs of a count per round, after a warm-up
ROUNDS = 2
CONTEXT = 192  # positions each synthetic sequence attends over: a chat turn's, where attention shows


@dataclass(frozen=True)
class StepCost:
    counts: tuple[int, ...]  # token counts timed, ascending, the first is 1
    seconds: tuple[float, ...]  # the general (layer by layer) path
    fused: StepCost | None = None  # the fused decode step, up to fused_limit decodes
    fused_limit: int = 0

    def step(self, tokens: int, decode_only: bool) -> float:
        """Seconds of a step of `tokens` tokens, drafts included: on the fused step's curve
        when the step holds decodes and drafts only and fits the fused step, else on the
        general path's."""
        if decode_only and self.fused is not None and tokens <= self.fused_limit:
            return self.fused.at(tokens)
        return self.at(tokens)

    def at(self, tokens: int) -> float:
        """Seconds of a step of `tokens` tokens: linear between the timed counts, and past
        the last one along the last segment's slope (compute bound, so linear)."""
        c, s = self.counts, self.seconds
        if tokens <= c[0]:
            return s[0]
        i = min(bisect.bisect_left(c, tokens), len(c) - 1)
        lo, hi = i - 1, i
        slope = (s[hi] - s[lo]) / (c[hi] - c[lo])
        return s[lo] + max(slope, 0.0) * (tokens - c[lo])

    def describe(self) -> str:
        text = ", ".join(f"{n}: {t * 1e3:.2f} ms" for n, t in zip(self.counts, self.seconds, strict=True))
        if self.fused is not None:
            text += f"; fused decode step up to {self.fused_limit}: {self.fused.describe()}"
        return text


_measured: dict[str, StepCost] = {}


def measure_step_cost(steps: SyntheticSteps, max_tokens: int) -> StepCost:
    """Time decode-shaped steps of 1, 2, 4, ... tokens up to max_tokens (and the cache's
    blocks), or read them back from an earlier start on this machine. The synthetic
    sequences write into the still empty cache, so requests never read what they wrote."""
    counts = [m for m in timing.COUNTS if m <= min(max_tokens, steps.num_blocks)]
    if len(counts) < 2:
        counts = [1, 2]  # a cache or budget this small still has two blocks and two tokens
    key = race_key(steps, counts)
    if key not in _measured:
        kept = race_memory.recall("spec-step-cost", key)
        if kept is not None:
            _measured[key] = from_json(kept)
        else:
            _measured[key] = _time_counts(steps, counts)
            if plausible(_measured[key]):
                race_memory.keep("spec-step-cost", key, to_json(_measured[key]))
    return _measured[key]


def race_key(steps: SyntheticSteps, counts: list[int]) -> str:
    """What the curves depend on besides the machine (race_memory adds that)."""
    return ":".join(map(str, (steps.cost_key, CONTEXT, ",".join(map(str, counts)), steps.fused_limit)))


def plausible(cost: StepCost) -> bool:
    """Whether the general curve looks like a quiet machine's (timing.plausible)."""
    return timing.plausible(dict(zip(cost.counts, cost.seconds, strict=True)))


def to_json(cost: StepCost) -> dict[str, Any]:
    fused = None if cost.fused is None else to_json(cost.fused)
    return {"counts": list(cost.counts), "seconds": list(cost.seconds), "fused": fused,
            "fused_limit": cost.fused_limit}


def from_json(kept: dict[str, Any]) -> StepCost:
    fused = None if kept["fused"] is None else from_json(kept["fused"])
    return StepCost(tuple(int(n) for n in kept["counts"]), tuple(float(t) for t in kept["seconds"]), fused,
                    int(kept["fused_limit"]))


def _time_counts(steps: SyntheticSteps, counts: list[int]) -> StepCost:
    steps.fill(max(counts) * -(-CONTEXT // steps.block_size))
    general = _curve(steps, counts, fused=False)
    if steps.fused_limit < 1:
        return general
    fused_counts = [m for m in counts if m <= steps.fused_limit]
    fused = _curve(steps, fused_counts, fused=True)
    return StepCost(general.counts, general.seconds, fused, steps.fused_limit)


def _curve(steps: SyntheticSteps, counts: list[int], fused: bool) -> StepCost:
    def step(m: int) -> float:
        return timing.best_time(steps.logits(m, CONTEXT, fused), REPS)

    with timing.racing(None):
        # Rounds over all counts, so that a burst of load on a shared machine spoils one
        # round's time of a count, not every time of it.
        seconds = [min(rounds) for rounds in zip(*([step(m) for m in counts] for _ in range(ROUNDS)), strict=True)]
    # Noise only ever lengthens a time, and a step never costs more than a bigger one: each
    # count is capped by the counts above it (a raised cost of a small step would make
    # drafting look cheaper than it is).
    for i in range(len(seconds) - 2, -1, -1):
        seconds[i] = min(seconds[i], seconds[i + 1])
    if len(counts) == 1:  # one point: flat up to the next count
        return StepCost((counts[0], counts[0] + 1), (seconds[0], seconds[0]))
    return StepCost(tuple(counts), tuple(seconds))

