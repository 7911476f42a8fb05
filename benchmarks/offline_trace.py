"""Every step of an offline run, and where its time went against a decode-rate grid.

Why: an offline request set's output rate sits below the best rate of the decode grid
(benchmarks/bench_sweep.py), and the gap has several causes that one overall figure
cannot tell apart: steps that carry prefill chunks, the tail of a finite set (fewer and
fewer sequences left once the queue is empty), contexts longer than the grid's best
cell, and whatever a real step costs beyond a synthetic one (sampling, bookkeeping,
ragged contexts). The schedule of a request set (the batch and chunks of every step) does
not depend on timings, so the trace's step shapes are exact; the grid then says what each
step would cost as a pure decode step, and the split below follows from that.

The trace is read from the engine's step listeners (StepStats), the public hook.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Any

from engine.types.stats import StepStats


@dataclass
class TracedStep:
    decodes: int
    prefill_tokens: int
    positions_read: int  # over every scheduled sequence: the positions its new tokens attend to (the last one's)
    mean_context: float  # of the decodes: the positions each attended to, its new one included
    running: int  # after the step
    waiting: int
    ms: float
    forward_ms: float


class StepTrace:
    """A step listener that keeps every step's shape and time."""

    def __init__(self) -> None:
        self.steps: list[TracedStep] = []

    def __call__(self, step: StepStats) -> None:
        # Contexts from the chunks, as the step read them: StepStats' mean_decode_context is
        # taken after the step's token was appended, one position past what it attended to.
        decode_contexts = [before + new for new, before in step.chunks if new == 1]
        self.steps.append(TracedStep(
            step.num_decodes, step.num_prefill_tokens, sum(before + new for new, before in step.chunks),
            round(sum(decode_contexts) / len(decode_contexts), 1) if decode_contexts else 0.0,
            step.num_running, step.num_waiting, round(step.step_time * 1e3, 3), round(step.forward_time * 1e3, 3)))

    def rows(self) -> list[dict[str, Any]]:
        return [asdict(s) for s in self.steps]


def grid_step_ms(grid: dict[int, dict[int, float]], batch: int, context: float) -> float:
    """Milliseconds of one pure decode step of `batch` sequences at `context` positions, from
    a grid of output tok/s (context -> batch -> tok/s): linear in batch between the grid's
    batches (through the origin below the smallest), linear in context, clamped outside."""
    contexts = sorted(grid)

    def at(c: int) -> float:
        row = grid[c]
        batches = sorted(row)
        ms = {b: b / row[b] * 1e3 for b in batches}
        if batch <= batches[0]:
            return ms[batches[0]]
        if batch >= batches[-1]:
            return ms[batches[-1]] * batch / batches[-1]
        i = bisect.bisect_left(batches, batch)
        lo, hi = batches[i - 1], batches[i]
        return ms[lo] + (ms[hi] - ms[lo]) * (batch - lo) / (hi - lo)

    if context <= contexts[0]:
        return at(contexts[0])
    if context >= contexts[-1]:
        return at(contexts[-1])
    i = bisect.bisect_left(contexts, context)
    lo, hi = contexts[i - 1], contexts[i]
    return at(lo) + (at(hi) - at(lo)) * (context - lo) / (hi - lo)


def decompose(steps: list[TracedStep], grid: dict[int, dict[int, float]], max_num_seqs: int) -> dict[str, Any]:
    """The run's time split by phase and cause, in seconds, against the grid.

    - ideal: every output token at the grid's best rate;
    - batch: the grid's step time at the step's batch, at the best cell's context, beyond
      ideal (a batch below the best cell's: the tail drain, mostly);
    - context: the grid's step at the step's own mean context beyond the same at the best
      cell's context;
    - prefill: the measured time of steps carrying prefill chunks beyond the grid's time
      for their decodes alone;
    - overhead: the measured time of pure decode steps beyond the grid's for them
      (sampling, bookkeeping, ragged contexts; on a busy machine, other processes too).
    Phases: "fill" while requests wait or the batch is full, "tail" once the queue is
    empty and the batch below the cap."""
    best_context, best_batch = max(((c, b) for c in grid for b in grid[c]), key=lambda cb: grid[cb[0]][cb[1]])
    best = grid[best_context][best_batch]
    phases: dict[str, dict[str, float]] = {}
    by_batch: dict[str, float] = {}
    out_tokens = 0
    context_sum = 0.0
    for s in steps:
        phase = "tail" if s.waiting == 0 and s.decodes < max_num_seqs and s.running < max_num_seqs else "fill"
        p = phases.setdefault(phase, dict.fromkeys(
            ("steps", "seconds", "output_tokens", "ideal", "batch", "context", "prefill", "overhead",
             "prefill_steps", "prefill_seconds"), 0.0))
        seconds = s.ms / 1e3
        decode_s = grid_step_ms(grid, s.decodes, s.mean_context) / 1e3 if s.decodes else 0.0
        at_best_context = grid_step_ms(grid, s.decodes, best_context) / 1e3 if s.decodes else 0.0
        p["steps"] += 1
        p["seconds"] += seconds
        p["output_tokens"] += s.decodes
        p["ideal"] += s.decodes / best
        p["batch"] += at_best_context - s.decodes / best
        p["context"] += decode_s - at_best_context
        if s.prefill_tokens:
            p["prefill"] += seconds - decode_s
            p["prefill_steps"] += 1
            p["prefill_seconds"] += seconds
        else:
            p["overhead"] += seconds - decode_s
        bucket = batch_bucket(s.decodes)
        by_batch[bucket] = by_batch.get(bucket, 0.0) + seconds
        out_tokens += s.decodes
        context_sum += s.decodes * s.mean_context
    total = sum(p["seconds"] for p in phases.values())
    predicted = sum(grid_step_ms(grid, s.decodes, s.mean_context) for s in steps if s.decodes) / 1e3
    return {
        "grid_best_tok_s": best, "grid_best_cell": {"batch": best_batch, "context": best_context},
        "steps": len(steps), "seconds": round(total, 2), "decode_tokens": out_tokens,
        "rate_tok_s": round(out_tokens / total, 1) if total else 0.0,
        "grid_predicted_tok_s": round(out_tokens / predicted, 1) if predicted else 0.0,
        "mean_decode_context": round(context_sum / max(out_tokens, 1), 1),
        "phases": {k: {n: round(v, 2) for n, v in p.items()} for k, p in phases.items()},
        "seconds_by_batch": {k: round(v, 2) for k, v in sorted(by_batch.items(), key=lambda kv: bucket_floor(kv[0]))},
    }


BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 192, 256)


def batch_bucket(decodes: int) -> str:
    i = bisect.bisect_right(BUCKETS, decodes) - 1
    lo = BUCKETS[i]
    hi = BUCKETS[i + 1] - 1 if i + 1 < len(BUCKETS) else None
    return f"{lo}" if hi == lo else f"{lo}-{hi if hi is not None else ''}"


def bucket_floor(bucket: str) -> int:
    return int(bucket.split("-")[0])


def summary(d: dict[str, Any]) -> str:
    """A few lines for sweep.md: the split of the offline run's time."""
    lines = [f"Offline run against the grid (best {d['grid_best_tok_s']:,.0f} tok/s at batch "
             f"{d['grid_best_cell']['batch']}, context {d['grid_best_cell']['context']}): "
             f"{d['rate_tok_s']:,.1f} decode tok/s measured, {d['grid_predicted_tok_s']:,.1f} predicted by the "
             f"grid for the same steps; mean decode context {d['mean_decode_context']}.", "",
             "| phase | steps | s | ideal s | batch | context | prefill | overhead |", "|---|" + "---:|" * 7]
    for name, p in d["phases"].items():
        lines.append(f"| {name} | {p['steps']:.0f} | {p['seconds']:.1f} | {p['ideal']:.1f} | {p['batch']:.1f} | "
                     f"{p['context']:.1f} | {p['prefill']:.1f} | {p['overhead']:.1f} |")
    lines += ["", "Seconds by decode batch: " + ", ".join(f"{k}: {v:.1f}" for k, v in d["seconds_by_batch"].items())]
    return "\n".join(lines) + "\n"
