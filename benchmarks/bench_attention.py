"""CPU attention: the attention share of a decode step, and prefill/extend attention by path.

    python -m benchmarks.bench_attention [--part both|decode|prefill|bf16] [--quick]
        decode:  [--batch 64] [--context 256] [--reps 5] [--kv-cache-dtype fp32 fp16 int8]
        prefill: [--chunks 128 512 1024] [--contexts 0 512] [--prefill-kv fp32 fp16 bf16 int8]
                 [--heads 9 --kv-heads 3 --head-dim 64] [--out-dir docs/results/attention]
        bf16:    [--prompt 1000] [--budget 512] [--heads 16 --kv-heads 8 --head-dim 128] [--reps 5]
        bf16-model: [--model qwen3-1.7b] [--prompt 1000] [--reps 5]

Decode: it times whole decode steps of the real model (packing, forward, logits) and, inside
them, the paged attention calls (the step profiler's forward hooks, engine/observers/profiler.py),
for each KV cache dtype: with the `cpu` attention backend (the CPU default: the C++
kernels where they build), and for fp32 also with `sdpa` (pure torch, never C++: it
gathers the batch's blocks).

Prefill: one sequence's chunk of new tokens after `context` cached positions, attended by
each path the cpu backend can take, on the engine's torch threads, best of a few: the fused
C++ kernel (reads the paged cache in place), the maskless path (gathers K/V, torch's flash
kernel per query tile) and the sdpa backend (gathers K/V, one SDPA call with a causal mask),
and where the kernel has bf16 products for the shape (AMX tiles, AVX512-BF16) and the cache
is fp32 or fp16, the kernel with them (`kernel-bf16`). Every ratio is of two timings of the
same run.

bf16: one prompt's prefill attention for one layer as the server cuts it (chunks of
--budget tokens, each after the ones before it, in an fp16 cache), by the kernel's fp32
body and by its bf16 products, alternating, on one thread, each timed by
time.thread_time() so that other processes on a busy machine do not count: the ratio of
the two is the figure (with --heads 16 --kv-heads 8 --head-dim 128, Qwen3 1.7B's).

bf16-model: whole prefills of --prompt random tokens (max_tokens 1) through the engine on a
real-shape GGUF (benchmarks/real_shapes.py; or a path) with `auto` quantization, on one
thread, the prefill kernel pinned, its bf16 products off and on alternating
(PAGODE_PREFILL_BF16 is read at every call), each timed by time.thread_time(): the ratio is
what bf16 attention gives a whole prefill.

The prefill table (markdown), the JSON and a plot go to --out-dir; --quick (a smoke run:
small sizes, one rep) writes under results/ instead.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.decode_probe import forward_seconds, held_decode_batch
from engine import envs, native
from engine.attention import prefill_choice
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.sdpa_backend import SdpaAttentionBackend
from engine.llm import LLM
from engine.observers.profiler import StepProfiler
from engine.runner.kv_cache import kv_cache_dtype
from engine.tuning import timing

BACKENDS = {"cpu": "cpu backend (C++ kernels where they build)",
            "sdpa": "sdpa backend (pure torch, gathers blocks)"}
PREFILL_PATHS = {"kernel": "fused C++ kernel (paged, in place)",
                 "maskless": "maskless (gathered K/V, torch flash per tile)",
                 "sdpa": "sdpa (gathered K/V, one call with a causal mask)",
                 "kernel-bf16": "fused C++ kernel, bf16 products"}


# ---- decode ----------------------------------------------------------------------
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


def run_decode(args: argparse.Namespace) -> None:
    print(f"decode step, batch {args.batch}, context {args.context}, torch threads {torch.get_num_threads()}")
    for kv in args.kv_cache_dtype:
        for backend in backends_for(kv):
            llm = LLM(kv_cache_memory="1GiB", max_model_len=2048, kv_cache_dtype=kv, attention_backend=backend)
            step, share = measure(llm, args.batch, args.context, args.reps)
            print(f"  KV {kv:4s} {BACKENDS[backend]:44s} step {step * 1000:7.1f} ms  {args.batch / step:6.1f} tok/s  "
                  f"attention {share:5.1%} of the step", flush=True)
            del llm


# ---- prefill ---------------------------------------------------------------------
def prefill_paths(heads: int, kv_heads: int, head_dim: int, kv: str, chunk: int,
                  context: int) -> dict[str, Callable[[], torch.Tensor]]:
    """Each path the cpu backend can take for this chunk, as a call on the same inputs."""
    query, cache, meta = prefill_choice.synthetic_chunk(heads, kv_heads, head_dim, 16, kv_cache_dtype(kv),
                                                        chunk=chunk, context=context)
    scale = head_dim ** -0.5
    cpu, sdpa = CpuAttentionBackend(), SdpaAttentionBackend()
    paths: dict[str, Callable[[], torch.Tensor]] = {
        "maskless": lambda: cpu.prefill_maskless(query, cache, meta, scale),
        "sdpa": lambda: sdpa.prefill(query, cache, meta, scale),
    }
    kernel = cpu.prefill_kernel
    if kernel is not None and kernel.supports(query, cache):
        paths["kernel"] = lambda: kernel.prefill(query, cache, meta.block_tables, meta.query_start_loc,
                                                 meta.seq_lens, scale)
        if kernel.has_bf16_products(head_dim, cache.dtype):
            paths["kernel-bf16"] = lambda: kernel.prefill(query, cache, meta.block_tables, meta.query_start_loc,
                                                          meta.seq_lens, scale, bf16=True)
    return paths


def run_prefill(args: argparse.Namespace) -> list[dict[str, Any]]:
    kernel = native.prefill_attention()
    print(f"prefill attention, {args.heads} heads / {args.kv_heads} KV heads x {args.head_dim}, "
          f"torch threads {torch.get_num_threads()}, kernels for {native.cpu_target().target}")
    rows = []
    for kv in args.prefill_kv:
        for context in args.contexts:
            for chunk in args.chunks:
                paths = prefill_paths(args.heads, args.kv_heads, args.head_dim, kv, chunk, context)
                with timing.racing(None):
                    ms = {name: timing.best_time(fn, args.prefill_reps) * 1e3 for name, fn in paths.items()}
                body = None if kernel is None else kernel.body(args.head_dim, kv_cache_dtype(kv))
                row = {"kv": kv, "chunk": chunk, "context": context, "ms": ms, "kernel_body": body}
                rows.append(row)
                print("  " + describe(row), flush=True)
    return rows


def describe(row: dict[str, Any]) -> str:
    ms = row["ms"]
    text = f"KV {row['kv']:4s} chunk {row['chunk']:5d} after {row['context']:4d}: " + "  ".join(
        f"{name} {ms[name]:8.2f} ms" for name in PREFILL_PATHS if name in ms)
    if "kernel" in ms:
        text += (f"  | maskless/kernel x{ms['maskless'] / ms['kernel']:.2f}"
                 f"  sdpa/kernel x{ms['sdpa'] / ms['kernel']:.2f}")
    if "kernel-bf16" in ms:
        text += f"  kernel/kernel-bf16 x{ms['kernel'] / ms['kernel-bf16']:.2f}"
    return text


def table(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| KV | chunk | context | " + " | ".join(f"{n} ms" for n in PREFILL_PATHS)
             + " | maskless / kernel | sdpa / kernel | kernel / kernel-bf16 | kernel body |",
             "|---|---:|---:|" + "---:|" * 7 + "---|"]
    for r in rows:
        ms = r["ms"]
        cells = [f"{ms[n]:.2f}" if n in ms else "–" for n in PREFILL_PATHS]
        ratios = [f"×{ms[n] / ms['kernel']:.2f}" if "kernel" in ms else "–" for n in ("maskless", "sdpa")]
        ratios.append(f"×{ms['kernel'] / ms['kernel-bf16']:.2f}" if "kernel-bf16" in ms else "–")
        lines.append(f"| {r['kv']} | {r['chunk']} | {r['context']} | " + " | ".join(cells + ratios)
                     + f" | {r['kernel_body'] or 'not built'} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """ms against chunk length, one panel per KV dtype, one line per path and context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kvs = list(dict.fromkeys(r["kv"] for r in rows))
    fig, axes = plt.subplots(1, len(kvs), figsize=(5 * len(kvs), 4), squeeze=False)
    for ax, kv in zip(axes[0], kvs, strict=True):
        for context, style in zip(sorted({r["context"] for r in rows}), ("-", "--", ":", "-."), strict=False):
            mine = [r for r in rows if r["kv"] == kv and r["context"] == context]
            for name in PREFILL_PATHS:
                points = [(r["chunk"], r["ms"][name]) for r in mine if name in r["ms"]]
                if points:
                    ax.plot(*zip(*points, strict=True), style, marker="o", label=f"{name}, context {context}")
        ax.set(title=f"KV {kv}", xlabel="chunk (tokens)", ylabel="ms", xscale="log", yscale="log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def server_chunks(prompt: int, budget: int, heads: int, kv_heads: int, head_dim: int,
                  ) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
    """A prompt of `prompt` tokens as the scheduler feeds it: chunks of `budget` tokens, each
    after the ones before it, in an fp16 cache of its own."""
    chunks = []
    for start in range(0, prompt, budget):
        n = min(budget, prompt - start)
        chunks.append(prefill_choice.synthetic_chunk(heads, kv_heads, head_dim, 16, torch.float16, chunk=n,
                                                     context=start))
    return chunks


def run_bf16_ratio(args: argparse.Namespace) -> float:
    """fp32 body against bf16 products on one layer's prefill attention, one thread, thread_time."""
    kernel = native.prefill_attention()
    if kernel is None or not kernel.has_bf16_products(args.head_dim, torch.float16):
        raise SystemExit("the kernel has no bf16 products here (a build below avx512, or this head size)")
    chunks = server_chunks(args.prompt, args.budget, args.heads, args.kv_heads, args.head_dim)
    scale = args.head_dim ** -0.5

    def attend(bf16: bool) -> float:
        start = time.thread_time()
        for query, cache, meta in chunks:
            kernel.prefill(query, cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale, bf16=bf16)
        return time.thread_time() - start

    times: dict[bool, list[float]] = {False: [], True: []}
    with timing.racing(1):
        for bf16 in (False, True):
            attend(bf16)  # warm-up: scratch, pages, tile state
        for _ in range(args.reps):
            for bf16 in (False, True):
                times[bf16].append(attend(bf16))
    fp32, products = min(times[False]), min(times[True])
    print(f"prefill attention of {args.prompt} tokens in chunks of {args.budget}, {args.heads} heads / "
          f"{args.kv_heads} KV heads x {args.head_dim}, fp16 cache, one thread, thread_time best of {args.reps}:\n"
          f"  fp32 body ({kernel.body(args.head_dim, torch.float16)}) {fp32 * 1e3:.1f} ms, "
          f"bf16 products ({kernel.body(args.head_dim, torch.float16, True)}) {products * 1e3:.1f} ms: "
          f"x{fp32 / products:.2f}\n  every run, ms: fp32 {[round(t * 1e3, 1) for t in times[False]]}, "
          f"bf16 {[round(t * 1e3, 1) for t in times[True]]}")
    return fp32 / products


def run_bf16_model(args: argparse.Namespace) -> float:
    """Whole prefills with the kernel's fp32 body and with its bf16 products, one process."""
    from benchmarks.real_shapes import SHAPES, gguf_file
    from engine.sampling_params import SamplingParams

    path = gguf_file(args.model) if args.model in SHAPES else Path(args.model)
    os.environ[envs.PREFILL_KERNEL.name] = "kernel"  # both sides on the kernel: only its body differs
    torch.set_num_threads(1)
    llm = LLM(model=str(path), quantization="auto", max_model_len=2 * args.prompt + 16, kv_cache_memory="1GiB",
              max_num_seqs=4)
    bf16_from = getattr(llm.engine.runner.backend, "bf16_from", None)
    params = SamplingParams(max_tokens=1, temperature=0)
    seeds = iter(range(1, 1 << 20))

    def prefill(mode: str) -> float:
        os.environ[envs.PREFILL_BF16.name] = mode
        ids = torch.randint(100, 30000, (args.prompt,), generator=torch.Generator().manual_seed(next(seeds))).tolist()
        start = time.thread_time()
        llm.generate([ids], params)
        return time.thread_time() - start

    prefill("on")  # warm-up
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.reps):
        for mode in times:
            times[mode].append(prefill(mode))
    off, on = min(times["off"]), min(times["on"])
    print(f"{path.name}: prefill of {args.prompt} tokens, one thread, thread_time best of {args.reps} "
          f"(bf16 steps from {bf16_from} tokens): fp32 attention {off:.2f} s ({args.prompt / off:.0f} tok/s), "
          f"bf16 attention {on:.2f} s ({args.prompt / on:.0f} tok/s): x{off / on:.2f}\n  every run, s: "
          f"off {[round(t, 2) for t in times['off']]}, on {[round(t, 2) for t in times['on']]}")
    return off / on


def write_prefill(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    out: Path = args.out_dir or (Path("results/attention-quick") if args.quick else Path("docs/results/attention"))
    out.mkdir(parents=True, exist_ok=True)
    target = native.cpu_target()
    header = (f"Prefill attention on {target.describe()}, torch threads {torch.get_num_threads()}, "
              f"{args.heads} heads / {args.kv_heads} KV heads x {args.head_dim}; best of {args.prefill_reps}.")
    report = {"cpu": target.describe(), "threads": torch.get_num_threads(), "quick": args.quick,
              "shape": [args.heads, args.kv_heads, args.head_dim], "rows": rows}
    (out / "prefill.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "prefill.md").write_text(table(rows, header))
    plot(rows, out / "prefill.png")
    print(f"wrote {out / 'prefill.md'}, prefill.json and prefill.png")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("both", "decode", "prefill", "bf16", "bf16-model"), default="both")
    ap.add_argument("--quick", action="store_true", help="a smoke run: small sizes, one rep, out under results/")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["fp32", "fp16", "int8"])
    ap.add_argument("--chunks", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--contexts", type=int, nargs="+", default=[0, 512])
    ap.add_argument("--prefill-kv", nargs="+", choices=("fp32", "fp16", "bf16", "int8"),
                    default=["fp32", "fp16", "bf16", "int8"])
    ap.add_argument("--prefill-reps", type=int, default=5)
    ap.add_argument("--heads", type=int, default=9)  # SmolLM2-135M's attention
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--out-dir", type=Path, default=None)
    ap.add_argument("--prompt", type=int, default=1000, help="bf16: the prompt's tokens")
    ap.add_argument("--budget", type=int, default=512, help="bf16: tokens per chunk (the CPU's token budget)")
    ap.add_argument("--model", default="qwen3-1.7b", help="bf16-model: a real shape's name, or a GGUF path")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.context, args.reps, args.kv_cache_dtype = 8, 64, 1, ["fp16"]
        args.chunks, args.prefill_reps = [128], 1
    if args.part == "bf16":
        run_bf16_ratio(args)
        return
    if args.part == "bf16-model":
        run_bf16_model(args)
        return
    if args.part in ("both", "prefill"):
        write_prefill(run_prefill(args), args)
    if args.part in ("both", "decode"):
        run_decode(args)


if __name__ == "__main__":
    main()
