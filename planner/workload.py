"""A workload to plan for: Poisson (Gamma) arrivals with uniform prompt and output lengths.

Drawn by pagode-loadgen's own functions (same seed -> same lengths and gaps), so that a
prediction and a measurement describe the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.arrivals import arrival_times
from loadgen.spans import draw_lengths


@dataclass(frozen=True)
class PlannedRequest:
    arrival: float  # seconds from the start
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class Workload:
    input_len: tuple[int, int] = (16, 128)
    output_len: tuple[int, int] = (32, 384)
    num_requests: int = 200
    burstiness: float = 1.0
    seed: int = 0

    def requests(self, rate: float) -> list[PlannedRequest]:
        """Lengths as loadgen's `text` dataset draws them; arrivals as its arrivals.py."""
        rng = np.random.default_rng(self.seed)
        inputs, outputs = draw_lengths(rng, self.num_requests, self.input_len, self.output_len)
        arrivals = arrival_times(self.num_requests, rate, self.burstiness, self.seed)
        return [PlannedRequest(float(a), int(i), int(o))
                for a, i, o in zip(arrivals, inputs, outputs, strict=True)]

