"""Arrival times: Gamma-distributed gaps, fixed by a seed before the run starts.

Definitions follow `vllm bench serve`: gaps have shape = burstiness and
scale = 1 / (rate * burstiness), so their mean is 1/rate whatever the burstiness and
their coefficient of variation is 1/sqrt(burstiness). Burstiness 1 is a Poisson process.
"""

from __future__ import annotations

import math

import numpy as np


def draw_gaps(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """n inter-arrival gaps in seconds; all zero for an infinite rate."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if not rate > 0:
        raise ValueError("rate must be > 0 (use inf to send everything at once)")
    if not burstiness > 0:
        raise ValueError("burstiness must be > 0")
    if math.isinf(rate):
        return np.zeros(n)
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Offsets from the run start at which each of n requests is sent.

    The first request goes at 0 and each later one one gap after the previous,
    as vLLM does; the same seed always gives the same trace.
    """
    rng = np.random.default_rng(seed)
    gaps = draw_gaps(max(n - 1, 0), rate, burstiness, rng)
    return np.concatenate([np.zeros(min(n, 1)), np.cumsum(gaps)])
