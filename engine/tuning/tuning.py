"""What this machine's load-time measurements chose for the engine: one result.

Why one: the batch cap and the speculative step cost are measured once, after the model and
its cache are loaded, and read by several parts (the scheduler's max_num_seqs, the drafter's
cost curve). `tune` measures them, or reads them back from an earlier start (race_memory.py),
and returns them; the engine builds its config and its parts from the result, so no
measurement writes the config. The kernels' own races (big-step GEMM, block kernel and its
tile body, prefill path, fused decode step) run while the model loads, each layer taking its
winner as it is built; `tune` runs after them and lists what they chose (`kernels`), which
the engine's description carries to the start-up log and /metrics (pagode:load_race_info).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.tuning import decode_rates, fused_step, gemm_choice, kernel_crossover, prefill_kernel, race_memory
from engine.tuning.batch_cap import BatchCap
from engine.tuning.step_cost import StepCost, measure_step_cost
from engine.tuning.steps import SyntheticSteps
from engine.tuning.timing import NO_LIMIT
from engine.types.info import KernelChoice

log = logging.getLogger("pagode")


# The races whose result is a kernel choice (the others are timings the sizes come from).
KERNEL_RACES = (gemm_choice.RACE, kernel_crossover.BLOCK_KERNEL, kernel_crossover.TILE_BODY, fused_step.RACE,
                prefill_kernel.RACE)


@dataclass(frozen=True)
class Tuning:
    batch_cap: BatchCap | None  # None: the config's max_num_seqs stands (a flag or a calibration set it)
    step_cost: StepCost | None  # None: the engine does not speculate
    kernels: tuple[KernelChoice, ...] = ()  # what the kernels' races chose in this process (pins aside)

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
    kernels = kernel_choices()
    log.info("kernel races: %d measured at this start, %d read back from an earlier one "
             "(pagode:load_race_info on /metrics lists them)",
             sum(k.source == "measured" for k in kernels), sum(k.source == "kept" for k in kernels))
    return Tuning(cap, cost, kernels)


def kernel_choices() -> tuple[KernelChoice, ...]:
    """The kernel races' results this process took so far, measured or read back, in race
    order. A process that loads several models lists them together: layers of one shape
    share a result whichever model holds them. A choice pinned by an environment variable
    ran no race and is not listed."""
    chosen = [KernelChoice(race, key, describe(result), source)
              for (race, key), (result, source) in race_memory.taken().items() if race in KERNEL_RACES]
    return tuple(sorted(chosen, key=lambda c: (KERNEL_RACES.index(c.race), c.key)))


def describe(result: object) -> str:
    """A kept result as one label: a name, or a crossover's token count."""
    if isinstance(result, dict):
        result = result.get("limit")
    if isinstance(result, int) and result >= NO_LIMIT:
        return "all"
    return str(result)
