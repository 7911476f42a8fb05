"""What this machine's load-time measurements chose for the engine's sizes: one result.

Why one: the batch cap and the speculative step cost are measured once, after the model and
its cache are loaded, and read by several parts (the scheduler's max_num_seqs, the drafter's
cost curve). `tune` measures them, or reads them back from an earlier start (race_memory.py),
and returns them; the engine builds its config and its parts from the result, so no
measurement writes the config. The kernels' own races (GEMM, block kernel, prefill path,
fused decode step) run while the model loads, before there is a cache to time steps on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.tuning import decode_rates
from engine.tuning.batch_cap import BatchCap
from engine.tuning.step_cost import StepCost, measure_step_cost
from engine.tuning.steps import SyntheticSteps

log = logging.getLogger("pagode")


@dataclass(frozen=True)
class Tuning:
    batch_cap: BatchCap | None  # None: the config's max_num_seqs stands (a flag or a calibration set it)
    step_cost: StepCost | None  # None: the engine does not speculate

    def max_num_seqs(self, default: int) -> int:
        return default if self.batch_cap is None else self.batch_cap.max_num_seqs


def tune(steps: SyntheticSteps, config: EngineConfig) -> Tuning:
    """The engine's load-time measurements on the runner's synthetic steps: the batch cap where
    the config asks for one (config.size_batch, or an ITL target), the step cost curve where
    it speculates."""
    cap = None
    if config.size_batch or config.max_itl_ms is not None:
        cap = decode_rates.size_batch(steps, config.max_num_seqs, config.max_itl_ms)
        log.info("max_num_seqs %d: %s", cap.max_num_seqs, cap.reason)
    cost = None
    if config.speculative_config is not None:
        cost = measure_step_cost(steps, config.token_budget)
        log.info("speculative decoding %s; step cost by tokens: %s", config.speculative_config, cost.describe())
    return Tuning(cap, cost)
