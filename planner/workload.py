"""A workload to plan for: Poisson (Gamma) arrivals with uniform prompt and output lengths.

Drawn the way pagode-loadgen draws its traces (same seed -> same lengths and gaps),
so that a prediction and a measurement describe the same requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
        n = self.num_requests
        inputs = rng.integers(self.input_len[0], self.input_len[1] + 1, size=n)
        outputs = rng.integers(self.output_len[0], self.output_len[1] + 1, size=n)
        arrivals = arrival_times(n, rate, self.burstiness, self.seed)
        return [PlannedRequest(float(a), int(i), int(o))
                for a, i, o in zip(arrivals, inputs, outputs, strict=True)]

    @property
    def mean_output_len(self) -> float:
        return (self.output_len[0] + self.output_len[1]) / 2


def arrival_times(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Gaps of shape `burstiness`, mean 1/rate; the first request at 0 (as vLLM and loadgen)."""
    if math.isinf(rate):
        return np.zeros(n)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=max(n - 1, 0))
    return np.concatenate([np.zeros(min(n, 1)), np.cumsum(gaps)])


def parse_range(text: str) -> tuple[int, int]:
    """'16:128' -> (16, 128); '64' -> (64, 64)."""
    lo, sep, hi = text.partition(":")
    low, high = int(lo), int(hi) if sep else int(lo)
    if low < 1 or high < low:
        raise ValueError(f"bad length range {text!r}: use MIN:MAX with 1 <= MIN <= MAX")
    return low, high
