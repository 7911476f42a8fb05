"""Choosing a kernel by measurement at load: time the candidates, keep the winner.

Every load-time race of the engine runs here: the block kernel against the dense GEMM at
each token count (kernel_crossover.py), the big-step GEMMs against each other
(gemm_choice.py), and the fused decode step against the layer-by-layer path
(model/decode_step.py). A candidate is timed after one warm-up call, best of a few runs,
under inference mode. A race between two kernels of one op runs on one thread (threads=1):
their ratio is what matters and both scale alike over threads, while a busy machine's
scheduler makes two-thread timings of a call this short worthless. A race between whole
steps runs on the engine's threads (threads=None), since how a path spreads over them is
part of what is compared.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the token (or sequence) counts a crossover race tries
NO_LIMIT = 1 << 30  # a crossover whose candidate won at every count measured


def best_time(fn: Callable[[], object], reps: int, warm_up: bool = True) -> float:
    """Seconds of fn(), best of `reps` runs, after a warm-up call unless `warm_up` is False."""
    if warm_up:
        fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@contextlib.contextmanager
def racing(threads: int | None) -> Iterator[None]:
    """Inference mode, on `threads` torch threads (None: as they are), restored after."""
    if threads is None:
        with torch.inference_mode():
            yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(before)


def fastest(candidates: Mapping[str, Callable[[], object]], reps: int,
            threads: int | None = 1) -> tuple[str, dict[str, float]]:
    """The name of the fastest candidate, and each one's seconds."""
    with racing(threads):
        times = {name: best_time(fn, reps) for name, fn in candidates.items()}
    return min(times, key=lambda name: times[name]), times


def plausible(seconds: Mapping[int, float]) -> bool:
    """Whether, of steps timed by their token (or sequence) count, some count ran at least
    twice the smallest one's tokens/s. Batching shares each step's weight reads, so on a
    quiet machine it always does; where none does, other processes stretched the bigger
    steps, and a kept result would misprice every later start."""
    smallest = min(seconds)
    return max(b / t for b, t in seconds.items()) >= 2 * smallest / seconds[smallest]


@dataclass
class Crossover:
    """Up to which count a candidate beats the incumbent (the counts are token or sequence counts)."""

    max_kernel_tokens: int  # the candidate runs calls of up to this many; the incumbent above
    timings_ms: dict[int, tuple[float, float]] = field(default_factory=dict)  # count -> (candidate, incumbent)

    def decide(self) -> None:
        """The largest count the candidate wins before the incumbent wins twice in a row."""
        self.max_kernel_tokens, losses = 0, 0
        for m in sorted(self.timings_ms):
            mine, theirs = self.timings_ms[m]
            if mine <= theirs:
                self.max_kernel_tokens, losses = m, 0
            else:
                losses += 1
                if losses == 2:
                    return
        if losses == 0 and self.timings_ms:
            self.max_kernel_tokens = NO_LIMIT  # the candidate won everywhere measured


def crossover(counts: Iterable[int], time_both: Callable[[int], tuple[float, float]], digits: int,
              threads: int | None = 1) -> Crossover:
    """Time (candidate, incumbent) in seconds at each count, in order, until the incumbent wins
    twice in a row; the candidate keeps every count up to its last win (Crossover.decide)."""
    result = Crossover(0)
    losses = 0
    with racing(threads):
        for m in counts:
            mine, theirs = time_both(m)
            result.timings_ms[m] = (round(mine * 1e3, digits), round(theirs * 1e3, digits))
            losses = losses + 1 if mine > theirs else 0
            if losses == 2:
                break
    result.decide()
    return result
