"""The attention share of a CPU decode step (batch 64, contexts of 256 by default).

    python -m benchmarks.bench_attention [--batch 64] [--context 256] [--reps 5] [--kv-cache-dtype fp32 fp16 int8]

It times whole decode steps of the real model (packing, forward, logits) and, inside
them, the paged attention calls (the step profiler's forward hooks, engine/io/profiler.py),
for each KV cache dtype: with the `cpu` attention backend (the CPU default: the C++
kernels where they build), and for fp32 also with `sdpa` (pure torch, never C++: it
gathers the batch's blocks).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.decode_probe import forward_seconds, held_decode_batch
from engine.io.profiler import StepProfiler
from engine.llm import LLM

BACKENDS = {"cpu": "cpu backend (C++ kernels where they build)",
            "sdpa": "sdpa backend (pure torch, gathers blocks)"}


def measure(llm: LLM, batch: int, context: int, reps: int) -> tuple[float, float]:
    """(seconds per decode step, attention share of it)."""
    runner = llm.engine.runner
    with held_decode_batch(llm, batch, context) as scheduled:
        forward_seconds(llm, scheduled, reps=1, warm_up=0)  # warm-up, unprofiled
        profiler = StepProfiler(runner, every=reps, report=lambda _: None)
        try:
            step = forward_seconds(llm, scheduled, reps, warm_up=0)
        finally:
            profiler.close()
    return step, profiler.window.ops.get("attention", 0.0) / reps / step


def backends_for(kv: str) -> list[str]:
    """The C++ path for every dtype; the pure-torch one for fp32, the dtype it is written for."""
    return ["cpu", "sdpa"] if kv == "fp32" else ["cpu"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["fp32", "fp16", "int8"])
    args = ap.parse_args(argv)
    print(f"decode step, batch {args.batch}, context {args.context}, torch threads {torch.get_num_threads()}")
    for kv in args.kv_cache_dtype:
        for backend in backends_for(kv):
            llm = LLM(kv_cache_memory="1GiB", max_model_len=2048, kv_cache_dtype=kv, attention_backend=backend)
            step, share = measure(llm, args.batch, args.context, args.reps)
            print(f"  KV {kv:4s} {BACKENDS[backend]:44s} step {step * 1000:7.1f} ms  {args.batch / step:6.1f} tok/s  "
                  f"attention {share:5.1%} of the step", flush=True)
            del llm


if __name__ == "__main__":
    main()
