"""What the load-time step timings ask of the engine's model runner: synthetic decode steps.

Why a protocol: the batch cap (decode_rates.py) and the speculative step cost (step_cost.py)
time whole decode steps of this model on this cache, while the runner, the model and the
attention metadata those steps are made of all sit above tuning/ (their kernels' races
use its timing and memory). The runner hands tuning/ an object of this shape
(engine/runner/synthetic_steps.py), so the measurements need no import of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class SyntheticSteps(Protocol):
    device_type: str  # "cpu" or "cuda"
    block_size: int
    num_blocks: int  # of the KV cache
    fused_limit: int  # the most decodes the fused C++ decode step runs (0: it does not run)
    rates_key: str  # what decode-step times depend on besides the machine (model, weights, dtypes, backend)
    cost_key: str  # what the step cost curve depends on besides the machine, its counts and fused limit

    def fill(self, blocks: int) -> None:
        """Write the cache's first `blocks` blocks, so that timed steps read real pages."""

    def forward(self, batch: int, context: int) -> Callable[[], object]:
        """One whole step of `batch` decodes at `context` positions, as the engine runs it."""

    def logits(self, batch: int, context: int, fused: bool) -> Callable[[], object]:
        """The same step on one path (the fused C++ step, or layer by layer), logits for every row."""
