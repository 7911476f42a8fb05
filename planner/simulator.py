"""A discrete-event simulation of the engine loop, on a fake clock.

It drives the real `Scheduler` and `BlockManager` through the engine step's own three
calls: `schedule`, then `execute` (here a timed fake: the fitted step-time model says how
long the step takes, the clock advances by that much, and every sequence whose last token
was computed gets one dummy token), then the scheduler's `update`, which adds the tokens
and frees finished requests' blocks at once, as in `LLMEngine.step`. Requests join the
queue when the clock passes their arrival, as the async engine applies new requests at
the start of the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.config import Batching, EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import Sequence
from engine.core.step_result import Picked, SeqUpdate, StepResult
from engine.request_limits import check_context
from engine.sampling_params import SamplingParams
from engine.types.errors import InvalidRequestError
from engine.types.outputs import RequestTimes
from planner.step_model import StepTimeModel, work_of
from planner.workload import PlannedRequest

GENERATED_TOKEN = 0
NO_DRAFT: list[int] = []  # the simulated engine does not speculate


@dataclass
class SimRequest:
    spec: PlannedRequest
    seq: Sequence
    token_times: list[float] = field(default_factory=list)
    finish: float | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.spec.arrival

    @property
    def e2e(self) -> float:
        assert self.finish is not None
        return self.finish - self.spec.arrival

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        n = len(self.token_times)
        return None if n < 2 else (self.token_times[-1] - self.token_times[0]) / (n - 1)

    def append(self, token_id: int, max_model_len: int) -> str | None:
        """The scheduler's update adds the step's token here; the planned output length is
        the only stop rule (the workload's requests ignore EOS)."""
        self.seq.append_token(token_id)
        return "length" if self.seq.num_output_tokens >= self.spec.output_len else None


@dataclass
class SimConfig:
    num_blocks: int
    block_size: int = 16
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 512
    watermark: float = 0.10
    batching: Batching = "paged"
    enable_prefix_caching: bool = True
    kv_window: int | None = None  # every layer's sliding window: older blocks are freed as in the engine

    def engine_config(self) -> EngineConfig:
        return EngineConfig(batching=self.batching, block_size=self.block_size,
                            max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens,
                            watermark=self.watermark,
                            enable_prefix_caching=self.enable_prefix_caching, device="cpu")


@dataclass
class SimResult:
    requests: list[SimRequest]
    duration: float
    steps: int
    preemptions: int
    max_running: int
    max_kv_usage: float
    unservable: int  # requests that can never fit the cache

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_times) for r in self.requests)


class TimedExecutor:
    """The engine's executor, faked: a step costs what the step-time model predicts for its
    work, on a clock of its own, and every sequence that completes its prefill samples one
    dummy token."""

    def __init__(self, model: StepTimeModel) -> None:
        self.model = model
        self.now = 0.0
        self.requests: dict[int, SimRequest] = {}  # by id() of the request's sequence

    def execute(self, out: SchedulerOutput) -> StepResult[SimRequest]:
        work = work_of((s.num_new_tokens, s.seq.num_computed_tokens) for s in out.scheduled)
        sampled = [self.requests[id(s.seq)] for s in out.scheduled if s.completes_prefill]
        self.now += self.model.predict(work)
        picks: list[Picked | BaseException] = [(GENERATED_TOKEN, None)] * len(sampled)
        return StepResult(sampled, [NO_DRAFT] * len(sampled), picks)


class Simulator:
    def __init__(self, config: SimConfig, model: StepTimeModel, seed: int = 0,
                 check_invariants: bool = False) -> None:
        """`check_invariants`: the scheduler checks its block accounting after every step."""
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.block_manager = BlockManager(config.num_blocks, config.block_size,
                                          config.enable_prefix_caching, window=config.kv_window)
        self.scheduler = Scheduler(config.engine_config(), self.block_manager, config.max_model_len,
                                   check_invariants=check_invariants)
        self.executor = TimedExecutor(model)

    def _make_request(self, i: int, spec: PlannedRequest) -> SimRequest:
        # Distinct random prompts: no accidental prefix-cache hits between requests.
        tokens = self.rng.integers(1, 2**31 - 1, size=spec.prompt_len).tolist()
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
        return SimRequest(spec, Sequence(f"sim-{i}", tokens, params, RequestTimes(spec.arrival)))

    def run(self, specs: list[PlannedRequest]) -> SimResult:
        reqs = [self._make_request(i, s) for i, s in enumerate(specs)]
        self.executor.requests = {id(r.seq): r for r in reqs}
        pending = iter(sorted(reqs, key=lambda r: r.spec.arrival))
        nxt = next(pending, None)
        clock = self.executor
        steps = max_running = unservable = 0
        max_kv = 0.0
        while nxt is not None or self.scheduler.has_unfinished():
            while nxt is not None and nxt.spec.arrival <= clock.now:
                if self._fits(nxt):
                    self.scheduler.add(nxt.seq)
                else:
                    unservable += 1
                nxt = next(pending, None)
            if not self.scheduler.has_unfinished():
                if nxt is not None:
                    clock.now = nxt.spec.arrival
                continue
            batch = self.scheduler.schedule()
            if batch.is_empty:
                if nxt is None:
                    raise RuntimeError("the scheduler stalled with nothing running")
                clock.now = max(clock.now, nxt.spec.arrival)
                continue
            result = self.executor.execute(batch)
            steps += 1
            # The step's peak: before its update frees the blocks of requests that finish.
            max_running = max(max_running, len(self.scheduler.running))
            max_kv = max(max_kv, self.block_manager.usage)
            self._record(self.scheduler.update(batch, result), clock.now)
        duration = max((r.finish or 0.0) for r in reqs) - min((r.spec.arrival for r in reqs), default=0.0)
        return SimResult([r for r in reqs if r.finish is not None], duration, steps,
                         self.scheduler.num_preemptions, max_running, max_kv, unservable)

    def _fits(self, req: SimRequest) -> bool:
        """Not what the engine refuses at add_request: its own rule, on this scheduler's limits."""
        try:
            check_context(req.spec.prompt_len, req.spec.output_len, self.scheduler.max_model_len,
                          self.scheduler.max_prompt_tokens)
        except InvalidRequestError:
            return False
        return True

    @staticmethod
    def _record(updates: list[SeqUpdate[SimRequest]], now: float) -> None:
        """The simulator's outputs: when each token came, and when each request finished."""
        for u in updates:
            u.request.token_times.append(now)
            if u.request.seq.finish_reason is not None:
                u.request.finish = now
