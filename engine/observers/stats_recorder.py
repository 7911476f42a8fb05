"""The engine's statistics, kept as it steps: counters since start, and one StepStats per
step for the step listeners (the server's metrics, the planner's calibration, profilers).

A step with no listener only adds to the counters, so an unobserved engine builds no
StepStats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.core.block_manager import BlockManager
from engine.core.request_state import RequestState
from engine.core.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from engine.core.step_result import StepResult
from engine.types.outputs import StreamDelta
from engine.types.spec_counters import SpecCounters
from engine.types.stats import EngineStats, FinishedRequestStats, StepStats


@dataclass
class StepPhases:
    """Seconds spent in the engine's phases of the current step (the executor's own phases,
    prepare, forward and sample, come in its result)."""

    schedule: float = 0.0
    postprocess: float = 0.0

    def lap(self, phase: str, since: float) -> float:
        """Add the time since `since` to `phase`; return now, the next phase's start."""
        now = time.monotonic()
        setattr(self, phase, getattr(self, phase) + now - since)
        return now


class StatsRecorder:
    def __init__(self, scheduler: Scheduler, block_manager: BlockManager) -> None:
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.totals = EngineStats()
        self.listeners: list[Callable[[StepStats], None]] = []
        self.phases = StepPhases()
        self.spec_before: SpecCounters | None = None  # the drafter's counters at the step's start

    def begin_step(self) -> float:
        """Reset the phase timers; return the step's start."""
        self.phases = StepPhases()
        drafter = self.scheduler.drafter
        self.spec_before = drafter.counters.copy() if drafter is not None and self.listeners else None
        return time.monotonic()

    def record_step(self, out: SchedulerOutput, result: StepResult[Any], start: float,
                    finished: list[FinishedRequestStats], deltas: list[StreamDelta]) -> None:
        """Count the step; hand its StepStats to every listener."""
        prompt_tokens = sum(s.num_new_tokens for s in out.scheduled if is_prompt_work(s))
        gen_tokens = sum(len(d.token_ids) for d in deltas)
        t = self.totals
        t.prompt_tokens_total += prompt_tokens
        t.generation_tokens_total += gen_tokens
        t.num_preemptions_total += len(out.preempted)
        t.num_steps_total += 0 if out.is_empty else 1
        if out.is_empty or not self.listeners:
            return
        step = self.step_stats(out, result, start, finished, prompt_tokens, gen_tokens)
        for listener in self.listeners:
            listener(step)

    def step_stats(self, out: SchedulerOutput, result: StepResult[Any], start: float,
                   finished: list[FinishedRequestStats], prompt_tokens: int, gen_tokens: int) -> StepStats:
        decodes = [s for s in out.scheduled if s.num_new_tokens - s.num_draft == 1]  # drafted or not
        drafted = sum(s.num_draft for s in out.scheduled)
        p = self.phases
        spec = self._spec_step()
        return StepStats(out.num_batched_tokens, prompt_tokens, gen_tokens, len(out.preempted),
                         len(self.scheduler.running), len(self.scheduler.waiting),
                         self.block_manager.usage, time.monotonic() - start, finished,
                         num_decodes=len(decodes), num_prefill_tokens=out.num_batched_tokens - len(decodes) - drafted,
                         mean_decode_context=sum(len(s.seq) for s in decodes) / len(decodes) if decodes else 0.0,
                         schedule_time=p.schedule, prepare_time=result.prepare_time,
                         forward_time=result.forward_time, sample_time=result.sample_time,
                         postprocess_time=p.postprocess,
                         chunks=[(s.num_new_tokens, s.seq.num_computed_tokens - s.num_new_tokens)
                                 for s in out.scheduled],
                         preempted=[seq.request_id for seq in out.preempted],
                         num_drafts=spec.num_drafts, num_draft_tokens=spec.num_draft_tokens,
                         num_accepted_tokens=spec.num_accepted_tokens)

    def _spec_step(self) -> SpecCounters:
        """This step's share of the drafter's counters (zeros without speculation)."""
        drafter = self.scheduler.drafter
        if drafter is None or self.spec_before is None:
            return SpecCounters()
        return drafter.counters.minus(self.spec_before)

    def snapshot(self) -> EngineStats:
        """Gauges now, counters since start."""
        t, bm = self.totals, self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=bm.usage, num_preemptions_total=t.num_preemptions_total,
            prompt_tokens_total=t.prompt_tokens_total, generation_tokens_total=t.generation_tokens_total,
            prefix_cache_queries_total=bm.prefix_queries, prefix_cache_hits_total=bm.prefix_hits,
            num_steps_total=t.num_steps_total, max_concurrent_seqs=self.scheduler.max_concurrent,
            spec_decode=None if self.scheduler.drafter is None else self.scheduler.drafter.counters.copy())


def finished_request_stats(state: RequestState) -> FinishedRequestStats:
    seq = state.seq
    return FinishedRequestStats(seq.request_id, seq.finish_reason or "abort", seq.num_prompt_tokens,
                                seq.num_output_tokens, seq.times, seq.num_cached_tokens)


def is_prompt_work(s: ScheduledSeq) -> bool:
    """Tokens read from the prompt (or recomputed), not the one newest generated token."""
    if s.num_draft:
        return False  # a verified draft is generation, not prompt
    return s.seq.num_computed_tokens - s.num_new_tokens < s.seq.num_prompt_tokens or s.num_new_tokens > 1
