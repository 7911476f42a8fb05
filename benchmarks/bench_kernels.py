"""Paged decode attention: Triton kernel vs the kernel tests' torch oracle
(benchmarks/kernel_reference.py), as memory bandwidth.

    make bench-kernels                      # = python -m benchmarks.bench_kernels
    python -m benchmarks.bench_kernels --peak-gbps 3350 --dtype bf16 --json out.json
    python -m benchmarks.bench_kernels --shapes 8:2048,64:4096   # batch:context pairs

Decode attention is memory-bound: each step reads every cached K/V byte once, so the
figure of merit is (bytes of K/V + Q read) / time, against the device's peak. GPU
numbers are printed only when measured on a CUDA device; on a CPU-only machine the
script says so and times only the torch reference, labelled CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

import torch

from benchmarks.kernel_reference import paged_decode_attention_ref

# Peak HBM bandwidth, GB/s, by a part of torch.cuda.get_device_name; the longest part the
# name contains wins, so "GH200" is not read as "H200", nor "H100 NVL" as "H100".
PEAK_GBPS = {"GH200": 4000.0, "H200": 4800.0, "H100 NVL": 3900.0, "H100 PCIe": 2000.0,
             "H100": 3350.0, "A100-SXM4-80GB": 2039.0, "A100 80GB PCIe": 1935.0,
             "A100": 1555.0, "L40S": 864.0, "L4": 300.0, "A10": 600.0,
             "RTX 4090": 1008.0, "RTX 3090": 936.0, "V100": 900.0, "T4": 320.0}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GPU_SHAPES = [(1, 1024), (1, 8192), (8, 2048), (32, 2048), (64, 4096), (128, 1024)]
CPU_SHAPES = [(1, 512), (8, 512)]


@dataclass
class Row:
    device: str
    batch: int
    context: int
    bytes_read: int
    ref_ms: float
    triton_ms: float | None = None
    triton_1split_ms: float | None = None
    num_splits: int | None = None


@dataclass
class Problem:
    query: torch.Tensor
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float

    @property
    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]:
        return self.query, self.kv_cache, self.block_tables, self.seq_lens, self.scale

    @property
    def bytes_read(self) -> int:
        kv_heads, head_dim = self.kv_cache.shape[3], self.kv_cache.shape[4]
        kv = 2 * int(self.seq_lens.sum()) * kv_heads * head_dim * self.kv_cache.element_size()
        return kv + self.query.numel() * self.query.element_size()


def make_problem(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                 block_size: int, dtype: torch.dtype, device: torch.device) -> Problem:
    """Every sequence at `context` positions, its blocks shuffled across the cache."""
    per_seq = -(-context // block_size)
    ids = torch.randperm(batch * per_seq, device=device).to(torch.int32)
    cache = torch.randn(2, batch * per_seq, block_size, kv_heads, head_dim, device=device,
                        dtype=dtype)
    return Problem(torch.randn(batch, heads, head_dim, device=device, dtype=dtype), cache,
                   ids.view(batch, per_seq),
                   torch.full((batch,), context, dtype=torch.int32, device=device),
                   head_dim**-0.5)


def time_ms(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median milliseconds per call, after warm-up (compilation, caches)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_gbps(name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    key = max((key for key in PEAK_GBPS if key in name), key=len, default=None)
    return None if key is None else PEAK_GBPS[key]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """BATCH:CONTEXT pairs, comma-separated."""
    try:
        shapes = [(int(b), int(c)) for b, c in (pair.split(":") for pair in text.split(","))]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--shapes wants BATCH:CONTEXT,..., not {text!r}") from err
    if not shapes or any(b < 1 or c < 1 for b, c in shapes):
        raise argparse.ArgumentTypeError("--shapes wants batches and contexts of at least 1")
    return shapes


def bench_gpu(args: argparse.Namespace, device: torch.device) -> list[Row]:
    from cuda_kernels.decode_attention import choose_num_splits, paged_decode_attention

    rows = []
    for batch, context in args.shapes or GPU_SHAPES:
        p = make_problem(batch, context, args.heads, args.kv_heads, args.head_dim,
                         args.block_size, DTYPES[args.dtype], device)
        splits = choose_num_splits(batch, args.kv_heads, context, device)
        ref_iters = max(3, args.iters // 4)  # the reference loops over sequences in Python
        rows.append(Row(
            "cuda", batch, context, p.bytes_read,
            ref_ms=time_ms(partial(paged_decode_attention_ref, *p.args), device, ref_iters),
            triton_ms=time_ms(partial(paged_decode_attention, *p.args, num_splits=splits),
                              device, args.iters),
            triton_1split_ms=time_ms(partial(paged_decode_attention, *p.args, num_splits=1),
                                     device, args.iters),
            num_splits=splits))
        del p
        torch.cuda.empty_cache()
    return rows


def bench_cpu_reference(args: argparse.Namespace) -> list[Row]:
    cpu = torch.device("cpu")
    rows = []
    for batch, context in args.shapes or CPU_SHAPES:
        p = make_problem(batch, context, args.heads, args.kv_heads, args.head_dim,
                         args.block_size, torch.float32, cpu)
        ref_ms = time_ms(partial(paged_decode_attention_ref, *p.args), cpu, 5)
        rows.append(Row("cpu", batch, context, p.bytes_read, ref_ms))
    return rows


def gbps(bytes_read: int, ms: float | None) -> float | None:
    return None if ms is None else bytes_read / (ms * 1e-3) / 1e9


def print_gpu_table(rows: list[Row], name: str, peak: float | None) -> None:
    peak_text = f"{peak:.0f} GB/s" if peak else "unknown (pass --peak-gbps)"
    print(f"device: {name}; peak {peak_text}")
    print(f"{'batch':>5} {'context':>7} {'MB read':>8} {'splits':>6} | {'triton ms':>9} "
          f"{'GB/s':>7} {'% peak':>6} | {'1-split ms':>10} {'GB/s':>7} | {'torch ref ms':>12} "
          f"{'GB/s':>7}")
    for r in rows:
        bw, bw1, bw_ref = (gbps(r.bytes_read, ms)
                           for ms in (r.triton_ms, r.triton_1split_ms, r.ref_ms))
        frac = f"{100 * bw / peak:6.1f}" if peak and bw else f"{'-':>6}"
        print(f"{r.batch:>5} {r.context:>7} {r.bytes_read / 1e6:>8.1f} {r.num_splits:>6} | "
              f"{r.triton_ms:>9.4f} {bw:>7.0f} {frac} | {r.triton_1split_ms:>10.4f} {bw1:>7.0f} | "
              f"{r.ref_ms:>12.3f} {bw_ref:>7.0f}")


def print_cpu_table(rows: list[Row]) -> None:
    print("CPU (torch reference only, fp32; not a GPU number):")
    for r in rows:
        print(f"  batch {r.batch:>3} context {r.context:>5}: {r.ref_ms:8.2f} ms, "
              f"{gbps(r.bytes_read, r.ref_ms):6.2f} GB/s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_kernels",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="device peak memory bandwidth in GB/s (default: from the name)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help=f"BATCH:CONTEXT,... (default: {GPU_SHAPES} on a GPU, {CPU_SHAPES} on the CPU)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    if torch.cuda.is_available():
        device = torch.device("cuda")
        name = torch.cuda.get_device_name(device)
        rows = bench_gpu(args, device)
        print_gpu_table(rows, name, peak_gbps(name, args.peak_gbps))
    else:
        print("No CUDA GPU present: the Triton kernels were not timed and no GPU number is "
              "reported. Run this on a machine with an NVIDIA GPU for the bandwidth figures.")
        rows = bench_cpu_reference(args)
        print_cpu_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
