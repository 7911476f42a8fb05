"""The serving overhead (`pagode plan --serving-overhead`) from two measured points.

The step-time model prices what the engine computes; a served step also pays for its SSE
events and the client parsing them, a fixed cost plus a cost per sequence in the step. Two
probes, at a small and a large batch, each give (sequences, seconds per step beyond the
engine's prediction); the line through them is that overhead.
"""

from __future__ import annotations


def fit_overhead(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of a + b x sequences through two (sequences, extra seconds per step) points,
    neither below 0: a probe that ran faster than the engine alone adds nothing."""
    (n1, d1), (n2, d2) = points
    if n1 == n2:
        raise ValueError("the two probes need different batch sizes")
    per_seq = max((d2 - d1) / (n2 - n1), 0.0)
    return max(d1 - per_seq * n1, 0.0), per_seq
