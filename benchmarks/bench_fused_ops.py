"""The lean step's fused ops: C++ (ctypes) against torch.compile (inductor) and eager torch.

    python -m benchmarks.bench_fused_ops [--tokens 1 16 64] [--reps 300]

The element-wise fusions (residual-add + RMSNorm, SiLU-and-mul) are a choice made by
measurement, between hand-written C++ and a compiler. For each op and decode-step size this
times one call of the C++ kernel, of eager torch, and of the same eager function compiled by inductor (its CPU
C++ backend), and reports inductor's compile time: once per shape with dynamic=False,
once for all shapes with dynamic=True. Best of a few rounds of `reps` calls.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine import native
from engine.model import fused_ops

HIDDEN, INTERMEDIATE, EPS = 576, 1536, 1e-5  # SmolLM2-135M


def eager_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r = residual + x
    return fused_ops.rms_norm_reference(r, w, EPS), r


def eager_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def per_call_us(fn: Callable[[], object], reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return best * 1e6


def first_call_s(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(tokens: list[int], reps: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    w = torch.rand(HIDDEN)
    kernel = native.fused_ops()
    cases: list[tuple[str, Callable[..., object], Callable[..., object], Callable[[int], tuple[torch.Tensor, ...]]]] = [
        ("add + RMSNorm", lambda x, r: fused_ops.add_rms_norm(x, r, w, EPS, kernel),
         lambda x, r: eager_add_rms_norm(x, r, w),
         lambda t: (torch.randn(t, HIDDEN), torch.randn(t, HIDDEN))),
        ("SiLU-and-mul", lambda g: fused_ops.silu_and_mul(g, kernel), eager_silu_and_mul,
         lambda t: (torch.randn(t, 2 * INTERMEDIATE),)),
    ]
    with torch.inference_mode():
        for name, cxx, eager, inputs in cases:
            torch._dynamo.reset()
            static = torch.compile(eager, dynamic=False)
            dynamic = torch.compile(eager, dynamic=True)
            for t in tokens:
                args = inputs(t)
                row: dict[str, object] = {"op": name, "tokens": t}
                row["compile_static_s"] = round(first_call_s(lambda: static(*args)), 2)  # noqa: B023
                row["compile_dynamic_s"] = round(first_call_s(lambda: dynamic(*args)), 2)  # noqa: B023
                row["cxx_us"] = round(per_call_us(lambda: cxx(*args), reps), 1)  # noqa: B023
                row["eager_us"] = round(per_call_us(lambda: eager(*args), reps), 1)  # noqa: B023
                row["inductor_static_us"] = round(per_call_us(lambda: static(*args), reps), 1)  # noqa: B023
                row["inductor_dynamic_us"] = round(per_call_us(lambda: dynamic(*args), reps), 1)  # noqa: B023
                print(row, flush=True)
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args(argv)
    if native.fused_ops() is None:
        raise SystemExit("the C++ fused ops did not build here")
    rows = bench(args.tokens, args.reps)
    print(f"\n{'op':16s} {'tokens':>6s} {'C++ us':>8s} {'eager us':>9s} {'inductor us':>12s} {'dyn. us':>8s} "
          f"{'compile s':>10s}")
    for r in rows:
        print(f"{r['op']!s:16s} {r['tokens']!s:>6s} {r['cxx_us']!s:>8s} {r['eager_us']!s:>9s} "
              f"{r['inductor_static_us']!s:>12s} {r['inductor_dynamic_us']!s:>8s} "
              f"{r['compile_static_s']!s:>5s}/{r['compile_dynamic_s']!s:<5s}")


if __name__ == "__main__":
    main()
