"""engine.tuning.timing, the one home of the load-time races: the threads each race runs on, and
the crossover's stopping rule, on candidates whose speed the test sets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine.tuning import timing


class FakeClock:
    """timing's perf_counter, advanced only by the candidates: each takes exactly the
    time the test gives it, whatever else the machine is doing."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_a_kernel_race_runs_on_one_thread_and_restores_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    before = torch.get_num_threads()
    seen: list[tuple[int, bool]] = []

    def note() -> None:
        seen.append((torch.get_num_threads(), torch.is_inference_mode_enabled()))
        clock.now += 0.001

    def slow() -> None:
        note()
        clock.now += 0.004

    winner, times = timing.fastest({"slow": slow, "fast": note}, reps=2)
    assert winner == "fast" and times == {"slow": pytest.approx(0.005), "fast": pytest.approx(0.001)}
    assert len(seen) == 2 * 3 and set(seen) == {(1, True)}  # a warm-up and two timed runs each
    assert torch.get_num_threads() == before


def test_the_fastest_is_the_best_of_its_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate whose first timed run is slow (a busy machine) still wins on its best."""
    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    runs = {"a": iter([0.0, 0.009, 0.002]), "b": iter([0.0, 0.003, 0.003])}

    def candidate(name: str) -> Callable[[], None]:
        def run() -> None:
            clock.now += next(runs[name])
        return run

    winner, times = timing.fastest({"a": candidate("a"), "b": candidate("b")}, reps=2)
    assert winner == "a" and times == {"a": pytest.approx(0.002), "b": pytest.approx(0.003)}


def test_a_step_race_keeps_the_engine_threads() -> None:
    before = torch.get_num_threads()
    seen: list[int] = []

    def time_both(m: int) -> tuple[float, float]:
        seen.append(torch.get_num_threads())
        return 1.0, 2.0

    assert timing.crossover([1, 2], time_both, digits=2, threads=None).max_kernel_tokens == timing.NO_LIMIT
    assert seen == [before, before]


def test_a_crossover_stops_after_two_losses_in_a_row() -> None:
    timed: list[int] = []
    speeds = {1: (1.0, 2.0), 2: (3.0, 2.0), 4: (1.0, 2.0), 8: (3.0, 2.0), 16: (3.0, 2.0), 32: (1.0, 2.0)}

    def time_both(m: int) -> tuple[float, float]:
        timed.append(m)
        return speeds[m]

    result = timing.crossover(speeds, time_both, digits=3)
    assert timed == [1, 2, 4, 8, 16]  # 32 is never timed
    assert result.max_kernel_tokens == 4
    assert result.timings_ms[4] == (1000.0, 2000.0)
