"""A discrete-event simulation of the engine loop, on a fake clock.

It drives the real `Scheduler` and `BlockManager` (not a copy of their logic): each
step the scheduler picks who runs, the fitted step-time model says how long the step
takes, the clock advances by that much, and every sequence whose last token was
computed gains one (dummy) token, exactly as `LLMEngine.step` does. Requests join the
queue when the clock passes their arrival, as the async engine applies new requests
at the start of the next step. Finished requests free their blocks at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from engine.config import Batching, EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.request_limits import check_context
from engine.sampling_params import SamplingParams
from engine.types.errors import InvalidRequestError
from engine.types.outputs import RequestTimes
from planner.step_model import StepTimeModel, work_of
from planner.workload import PlannedRequest

GENERATED_TOKEN = 0


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


class Simulator:
    def __init__(self, config: SimConfig, model: StepTimeModel, seed: int = 0,
                 check_invariants: bool = False) -> None:
        self.config = config
        self.model = model
        self.rng = np.random.default_rng(seed)
        self.check = check_invariants
        self.block_manager = BlockManager(config.num_blocks, config.block_size,
                                          config.enable_prefix_caching, window=config.kv_window)
        self.scheduler = Scheduler(config.engine_config(), self.block_manager, config.max_model_len)
        self.now = 0.0

    def _make_request(self, i: int, spec: PlannedRequest) -> SimRequest:
        # Distinct random prompts: no accidental prefix-cache hits between requests.
        tokens = self.rng.integers(1, 2**31 - 1, size=spec.prompt_len).tolist()
        params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
        return SimRequest(spec, Sequence(f"sim-{i}", tokens, params, RequestTimes(spec.arrival)))

    def run(self, specs: list[PlannedRequest]) -> SimResult:
        reqs = [self._make_request(i, s) for i, s in enumerate(specs)]
        order = sorted(reqs, key=lambda r: r.spec.arrival)
        by_seq = {id(r.seq): r for r in reqs}
        pending = iter(order)
        nxt = next(pending, None)
        steps = max_running = unservable = 0
        max_kv = 0.0
        while nxt is not None or self.scheduler.has_unfinished():
            while nxt is not None and nxt.spec.arrival <= self.now:
                if self._fits(nxt):
                    self.scheduler.add(nxt.seq)
                else:
                    unservable += 1
                nxt = next(pending, None)
            if not self.scheduler.has_unfinished():
                if nxt is not None:
                    self.now = nxt.spec.arrival
                continue
            out = self.scheduler.schedule()
            if out.is_empty:
                if nxt is None:
                    raise RuntimeError("the scheduler stalled with nothing running")
                self.now = max(self.now, nxt.spec.arrival)
                continue
            work = work_of((s.num_new_tokens, s.seq.num_computed_tokens) for s in out.scheduled)
            to_sample = [s.seq for s in out.scheduled if s.completes_prefill]  # before advance
            self.now += self.model.predict(work)
            self.scheduler.advance(out)
            steps += 1
            max_running = max(max_running, len(self.scheduler.running))
            max_kv = max(max_kv, self.block_manager.usage)
            for seq in to_sample:
                self._emit(by_seq[id(seq)])
            if self.check:
                self._check()
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

    def _emit(self, req: SimRequest) -> None:
        req.seq.append_token(GENERATED_TOKEN)
        req.token_times.append(self.now)
        if req.seq.num_output_tokens >= req.spec.output_len:
            req.finish = self.now
            self.scheduler.remove(req.seq)

    def _check(self) -> None:
        seqs = list(itertools.chain(self.scheduler.running, self.scheduler.waiting))
        self.block_manager.check_invariants(seqs)
