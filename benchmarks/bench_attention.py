"""The attention share of a CPU decode step (batch 64, contexts of 256 by default).

    python -m engine.bench_attention [--batch 64] [--context 256] [--reps 5] [--kv-cache-dtype fp32 fp16]

It times whole decode steps of the real model (packing, forward, logits) and, inside
them, the paged attention calls (forward hooks of engine/profiler.py), for each KV
cache dtype: with the C++ kernel, and for fp32 also with the pure-torch gather path.
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.attention import cpu_kernels
from engine.bench import probe_decode_batch, release
from engine.llm import LLM
from engine.profiler import StepProfiler


def measure(llm: LLM, batch: int, context: int, reps: int, use_kernel: bool) -> tuple[float, float]:
    """(seconds per decode step, attention share of it)."""
    runner = llm.engine.runner
    runner.backend.use_cpu_kernel = use_kernel  # type: ignore[attr-defined]
    scheduled = probe_decode_batch(llm, batch, context)
    try:
        runner.forward(runner.prepare(scheduled))  # warm-up
        profiler = StepProfiler(runner.model, every=reps, report=lambda _: None)
        start = time.perf_counter()
        for _ in range(reps):
            runner.forward(runner.prepare(scheduled))
        step = (time.perf_counter() - start) / reps
        profiler.close()
    finally:
        runner.backend.use_cpu_kernel = True  # type: ignore[attr-defined]
        release(llm, scheduled)
    return step, profiler.window.ops.get("attention", 0.0) / reps / step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["fp32", "fp16"])
    args = ap.parse_args(argv)
    print(f"decode step, batch {args.batch}, context {args.context}, torch threads {torch.get_num_threads()}")
    for kv in args.kv_cache_dtype:
        llm = LLM(kv_cache_memory="1GiB", max_model_len=2048, kv_cache_dtype=kv)
        paths = [("C++ kernel (in place)", True)] if cpu_kernels.load() is not None else []
        if kv == "fp32" or not paths:
            paths.append(("pure torch (gather the batch's blocks)", False))
        for name, use_kernel in paths:
            step, share = measure(llm, args.batch, args.context, args.reps, use_kernel)
            print(f"  KV {kv:4s} {name:40s} step {step * 1000:7.1f} ms  {args.batch / step:6.1f} tok/s  "
                  f"attention {share:5.1%} of the step", flush=True)
        del llm


if __name__ == "__main__":
    main()
