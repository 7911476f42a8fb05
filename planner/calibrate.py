"""`pagode plan --calibrate`: time real engine steps over a grid and fit the step-time model.

For each (decode batch B, context C) of the grid, B requests with random prompts of C
tokens are prefilled (in chunks of the token budget), then decoded for a few steps; for
each prefill chunk size P, one more request of P tokens joins, so that step mixes B
decodes with a prefill chunk. Step times come from the engine's step listeners
(`StepStats.step_time`: schedule + forward + sampling + post-processing); what each step
computed comes from the same `StepStats` (`chunks`). Prefix caching is off so that random
prompts never share blocks. A first request warms the model up and is not recorded.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import envs
from engine.config import EngineConfig, dtype_name
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from engine.tuning import batch_cap
from engine.tuning.batch_cap import BatchCap
from engine.types.stats import StepStats
from planner.memory import device_dtypes, kv_bytes_per_token
from planner.step_model import StepTimeModel, StepWork, fit, work_of


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    chunks: tuple[int, ...]
    decode_steps: int = 3

    @classmethod
    def for_device(cls, device: str) -> Grid:
        if device == "cuda":
            return cls((1, 8, 32, 128, 256), (128, 1024), (128, 512, 2048), 4)
        # both pieces of the step model: fused decode steps (the small batches) and layer by layer,
        # and batches big enough to see where a bigger one stops paying (engine/tuning/batch_cap.py)
        return cls((1, 4, 12, 24, 48, 96, 192), (32, 192), (64, 256, 512), 3)


def default_fit_path(model_name: str, device: str, weights: str, kv: str) -> Path:
    """One fit per model, device, weights (fp32, int4, ...) and KV dtype: each times differently."""
    root = envs.CACHE_DIR.get()
    return root / "plan" / f"{model_name}-{device}-{weights}-{kv}.json"


def fit_path_for(config: EngineConfig) -> Path:
    """Where `pagode plan --calibrate` keeps the fit of the engine that `config` builds."""
    from engine.model.loader import resolve_model

    kv_dtype, w_dtype = device_dtypes(config)
    return default_fit_path(resolve_model(config.model).name, config.torch_device.type, w_dtype, kv_dtype)


def calibrated_batch_cap(config: EngineConfig) -> BatchCap | None:
    """max_num_seqs for `config` from its kept calibration's decode rates (engine/tuning/batch_cap.py
    holds the rule); None where there is no calibration. A user's --max-num-seqs wins over it."""
    path = fit_path_for(config)
    if not path.exists():
        return None
    meta = StepTimeModel.load(path).meta
    return batch_cap.from_decode_rates(meta.get("decode_tok_s") or {}, str(path), config.max_num_seqs)


class StepRecorder:
    """A step listener: (work, seconds) for every recorded step."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.works: list[StepWork] = []
        self.times: list[float] = []
        self.recording = False

    def __call__(self, step: StepStats) -> None:
        if not self.recording:
            return
        self.works.append(work_of(step.chunks))
        self.times.append(step.step_time)


def decode_rates(works: list[StepWork], times: list[float], contexts: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """Measured decode tokens/s of the decode-only steps, per grid context and batch size:
    {context: {batch: batch / median step seconds}}, each step filed under the grid context
    nearest its mean context."""
    seconds: dict[tuple[int, int], list[float]] = {}
    for work, t in zip(works, times, strict=True):
        if work.prefill_tokens or not work.decode_seqs:
            continue
        mean = work.decode_context / work.decode_seqs
        context = min(contexts, key=lambda c: abs(c - mean))
        seconds.setdefault((context, work.decode_seqs), []).append(t)
    rates: dict[str, dict[str, float]] = {}
    for (context, batch), ts in sorted(seconds.items()):
        rates.setdefault(str(context), {})[str(batch)] = round(batch / float(np.median(ts)), 1)
    return rates


def kv_memory_for(grid: Grid, kv_bytes_per_token: int, block_size: int) -> int:
    most = max(b * (c + grid.decode_steps * (len(grid.chunks) + 1) + 2 * block_size)
               for b in grid.batches for c in grid.contexts) + max(grid.chunks) + block_size
    return int(most * kv_bytes_per_token / 0.85)


class Calibration:
    def __init__(self, engine: LLMEngine, grid: Grid, seed: int = 0,
                 log: Callable[[str], None] = print) -> None:
        self.engine = engine
        self.grid = grid
        self.rng = np.random.default_rng(seed)
        self.recorder = StepRecorder(engine)
        engine.step_listeners.append(self.recorder)
        self.ids = itertools.count()
        self.log = log

    def _prompt(self, n: int) -> list[int]:
        return self.rng.integers(100, self.engine.model_config.vocab_size, size=n).tolist()

    def _add(self, prompt_len: int, max_tokens: int) -> str:
        rid = f"cal-{next(self.ids)}"
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.engine.add_request(rid, self._prompt(prompt_len), params)
        return rid

    def _step_until_decoding(self) -> None:
        while any(s.is_prefilling or s.num_computed_tokens == 0
                  for s in list(self.engine.scheduler.running) + list(self.engine.scheduler.waiting)):
            self.engine.step()

    def warm_up(self) -> None:
        rid = self._add(max(self.grid.chunks), 4)
        while self.engine.has_unfinished():
            self.engine.step()
        del rid

    def run_point(self, batch: int, context: int) -> None:
        g = self.grid
        room = self.engine.max_model_len - context - 1
        ids = [self._add(context, room) for _ in range(batch)]
        self._step_until_decoding()
        for chunk in (*g.chunks, None):
            for _ in range(g.decode_steps):
                self.engine.step()
            if chunk is None:
                break
            extra = self._add(chunk, 2)
            self.engine.step()  # B decodes + one prefill chunk
            self.engine.abort_request(extra)
        for rid in ids:
            self.engine.abort_request(rid)

    def run(self) -> StepTimeModel:
        started = time.monotonic()
        self.warm_up()
        self.recorder.recording = True
        for batch, context in itertools.product(self.grid.batches, self.grid.contexts):
            self.run_point(batch, context)
            self.log(f"  batch {batch:4d} x context {context:5d}: {len(self.recorder.times)} steps "
                     f"timed, {time.monotonic() - started:.0f} s")
        self.engine.check_invariants()
        step = self.engine.runner.decode_step
        model = fit(self.recorder.works, self.recorder.times, str(self.engine.runner.device.type),
                    step.max_tokens if step is not None else 0)
        model.meta.update(self.describe(time.monotonic() - started))
        model.meta["decode_tok_s"] = decode_rates(self.recorder.works, self.recorder.times, self.grid.contexts)
        return model

    def describe(self, seconds: float) -> dict[str, object]:
        e = self.engine
        return {"model": e.model_name, "dtype": str(e.runner.dtype).removeprefix("torch."),
                "quantization": e.config.quantization, "kv_cache_dtype": dtype_name(e.runner.kv_dtype),
                "attention": e.runner.backend.name, "token_budget": e.config.token_budget,
                "grid": {"batches": list(self.grid.batches), "contexts": list(self.grid.contexts),
                         "chunks": list(self.grid.chunks)},
                "calibration_s": seconds,
                "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def calibrate(config: EngineConfig, grid: Grid | None = None,
              log: Callable[[str], None] = print) -> StepTimeModel:
    """Load the model, time the grid, return the fit. config.kv_cache_memory is raised to fit the grid."""
    from engine.model.loader import read_config, resolve_model

    device = config.torch_device.type
    grid = grid or Grid.for_device(device)
    cfg = read_config(resolve_model(config.model))
    kv_dtype, _ = device_dtypes(config)
    need = kv_memory_for(grid, kv_bytes_per_token(cfg, kv_dtype), config.block_size)
    config.kv_cache_memory = max(config.kv_cache_bytes, need)
    config.enable_prefix_caching = False
    budget = config.token_budget
    if max(grid.chunks) > budget:
        grid = Grid(grid.batches, grid.contexts, tuple(c for c in grid.chunks if c <= budget) or (budget,),
                    grid.decode_steps)
    engine = LLMEngine(config)
    log(f"calibrating on {device}: batches {grid.batches}, contexts {grid.contexts}, "
        f"prefill chunks {grid.chunks}")
    return Calibration(engine, grid, seed=config.seed, log=log).run()
