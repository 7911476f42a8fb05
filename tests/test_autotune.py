"""engine.autotune, the one home of the load-time races: the threads each race runs on, and
the crossover's stopping rule, on candidates whose speed the test sets."""

from __future__ import annotations

import time

import torch

from engine import autotune


def test_a_kernel_race_runs_on_one_thread_and_restores_the_others() -> None:
    before = torch.get_num_threads()
    seen: list[tuple[int, bool]] = []

    def note() -> None:
        seen.append((torch.get_num_threads(), torch.is_inference_mode_enabled()))
        time.sleep(0.001)

    def slow() -> None:
        note()
        time.sleep(0.004)

    winner, times = autotune.fastest({"slow": slow, "fast": note}, reps=2)
    assert winner == "fast" and times["fast"] < times["slow"]
    assert set(seen) == {(1, True)}
    assert torch.get_num_threads() == before


def test_a_step_race_keeps_the_engine_threads() -> None:
    before = torch.get_num_threads()
    seen: list[int] = []

    def time_both(m: int) -> tuple[float, float]:
        seen.append(torch.get_num_threads())
        return 1.0, 2.0

    assert autotune.crossover([1, 2], time_both, digits=2, threads=None).max_kernel_tokens == autotune.NO_LIMIT
    assert seen == [before, before]


def test_a_crossover_stops_after_two_losses_in_a_row() -> None:
    timed: list[int] = []
    speeds = {1: (1.0, 2.0), 2: (3.0, 2.0), 4: (1.0, 2.0), 8: (3.0, 2.0), 16: (3.0, 2.0), 32: (1.0, 2.0)}

    def time_both(m: int) -> tuple[float, float]:
        timed.append(m)
        return speeds[m]

    result = autotune.crossover(speeds, time_both, digits=3)
    assert timed == [1, 2, 4, 8, 16]  # 32 is never timed
    assert result.max_kernel_tokens == 4
    assert result.timings_ms[4] == (1000.0, 2000.0)
