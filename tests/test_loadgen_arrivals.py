"""The arrival process: Gamma gaps with shape = burstiness and mean 1/rate, fixed by the seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.arrivals import arrival_times, draw_gaps

N = 10_000


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
@pytest.mark.parametrize("rate", [0.3, 5.0, 120.0])
def test_gaps_match_gamma_mean_and_cv(rate: float, burstiness: float) -> None:
    gaps = draw_gaps(N, rate, burstiness, np.random.default_rng(1234))
    mean, cv = gaps.mean(), gaps.std() / gaps.mean()
    # Gamma(k, 1/(r k)): mean 1/r, coefficient of variation 1/sqrt(k).
    assert mean == pytest.approx(1.0 / rate, rel=0.04)
    assert cv == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.05)


def test_poisson_gaps_are_exponential() -> None:
    # Burstiness 1: P(gap > mean) = exp(-1) for an exponential distribution.
    gaps = draw_gaps(N, 2.0, 1.0, np.random.default_rng(7))
    assert np.mean(gaps > 0.5) == pytest.approx(math.exp(-1), abs=0.015)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert not draw_gaps(N, math.inf, 1.0, np.random.default_rng(0)).any()
    assert not arrival_times(50, math.inf, 0.5, seed=3).any()


def test_trace_is_fixed_by_the_seed() -> None:
    a = arrival_times(500, 4.0, 1.0, seed=42)
    b = arrival_times(500, 4.0, 1.0, seed=42)
    c = arrival_times(500, 4.0, 1.0, seed=43)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_arrival_times_start_at_zero_and_accumulate_gaps() -> None:
    times = arrival_times(1001, 10.0, 1.0, seed=5)
    assert len(times) == 1001 and times[0] == 0.0
    assert np.all(np.diff(times) >= 0)
    # 1000 gaps of mean 0.1 s.
    assert times[-1] == pytest.approx(100.0, rel=0.08)
    assert len(arrival_times(0, 1.0)) == 0 and list(arrival_times(1, 1.0)) == [0.0]


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_bad_parameters_are_rejected(rate: float, burstiness: float) -> None:
    with pytest.raises(ValueError):
        draw_gaps(10, rate, burstiness, np.random.default_rng(0))
