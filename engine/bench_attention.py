"""The attention share of a CPU decode step (batch 64, contexts of 256 by default).

    python -m engine.bench_attention [--batch 64] [--context 256] [--reps 5]

It times whole decode steps of the real model (packing, forward, logits) and, inside
them, the attention backend's calls (cache write and paged decode attention), for
the C++ kernel path and for the pure-torch gather path, in one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from engine.attention import cpu_kernels
from engine.bench import probe_decode_batch, release
from engine.llm import LLM


class Stopwatch:
    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def measure(llm: LLM, batch: int, context: int, reps: int, use_kernel: bool) -> tuple[float, float]:
    """(seconds per decode step, attention share of it)."""
    runner = llm.engine.runner
    backend = runner.backend
    backend.use_cpu_kernel = use_kernel  # type: ignore[attr-defined]
    scheduled = probe_decode_batch(llm, batch, context)
    watch = Stopwatch()
    originals = backend.write_kv, backend.decode
    backend.write_kv, backend.decode = watch.wrap(backend.write_kv), watch.wrap(backend.decode)  # type: ignore[method-assign]
    try:
        runner.forward(runner.prepare(scheduled))  # warm-up
        watch.seconds = 0.0
        start = time.perf_counter()
        for _ in range(reps):
            runner.forward(runner.prepare(scheduled))
        step = (time.perf_counter() - start) / reps
    finally:
        backend.write_kv, backend.decode = originals  # type: ignore[method-assign]
        release(llm, scheduled)
    return step, watch.seconds / reps / step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    llm = LLM(kv_cache_memory="1GiB", max_model_len=2048)
    print(f"decode step, batch {args.batch}, context {args.context}, torch threads {torch.get_num_threads()}")
    paths = [("C++ kernel (in place)", True)] if cpu_kernels.load() is not None else []
    for name, use_kernel in [*paths, ("pure torch (gather the batch's blocks)", False)]:
        step, share = measure(llm, args.batch, args.context, args.reps, use_kernel)
        print(f"  {name:40s} step {step * 1000:7.1f} ms  {args.batch / step:6.1f} tok/s  "
              f"attention {share:5.1%} of the step")


if __name__ == "__main__":
    main()
