"""Logprob values that JSON can carry.

A logprob can be -inf (a token masked out by min_tokens or logit_bias) or, after a numeric
fault, NaN. Neither is valid JSON; like vLLM, -inf becomes -9999.0, and so does NaN, so
that a strict JSON parser never sees a literal `NaN` or `-Infinity` in a response.
"""

from __future__ import annotations

import math

FLOOR = -9999.0


def finite_logprob(value: float) -> float:
    if math.isnan(value) or value < FLOOR:
        return FLOOR
    return min(float(value), 0.0) if math.isfinite(value) else FLOOR
