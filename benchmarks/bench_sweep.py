"""Decode throughput across batch size × context length, and the offline rate of a serving
request set beside it, in one run: `make bench-sweep`.

    python -m benchmarks.bench_sweep [--batches 1 8 32 64 128 192] [--contexts 100 300 600]
                                     [--num-prompts 160] [--quantization auto] [--out docs/results/sweep] [--quick]
                                     [--trace trace.json] [--grid-from sweep.json] [--max-num-seqs N]

Why: a decode step's rate rises with the batch while the weights' fixed cost dominates, and
falls once each sequence's own cost (attention over its context, its share of the GEMMs)
does. Where that turn lies, per context length, is what the batch cap and the kernels are
judged by. Each grid cell times whole decode steps (the fused C++ step where it applies, the
lm_head included) on synthetic decodes at that context, as the start-up race does
(engine/tuning/decode_rates.py), best of two. The weights are quantized as `pagode serve`
serves them (`--quantization auto`, the library's default too) unless told otherwise: `none`
keeps fp32 weights, which no fused step can run, so its batch-1 cells time the layer-by-layer
path reading 540 MB of weights a token rather than the served step.

Then the request set of the 16 req/s workload (prompts 16-128 tokens, outputs 32-384, the
same seed as bench-vs-peers) is given to the offline engine all at once, with the shipped
defaults, the measured batch cap included, and its output rate is set against the best rate
of the grid: the gap is what scheduling, prefill chunks and growing contexts cost.

With --trace, every step of the offline run (its decodes, prefill tokens, positions read and
time) goes to a JSON file, with the run's time split against the grid: the tail drain, the
steps carrying prefill chunks, the contexts, the overhead (benchmarks/offline_trace.py).
--grid-from reads the grid of an earlier sweep.json instead of timing one, so that a run's
step shapes can be set against a grid measured on a quiet machine.

Writes sweep.json, sweep.md and sweep.png into --out.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import offline_trace
from benchmarks.bench_engine import run_engine
from engine.llm import LLM
from engine.native import cpu_target
from engine.runner.synthetic_steps import RunnerSteps
from engine.sampling_params import SamplingParams
from engine.tuning import decode_rates
from loadgen.prose import prose_token_ids


def time_grid(llm: LLM, batches: list[int], contexts: list[int]) -> dict[int, dict[int, float]]:
    """context -> batch -> output tokens/s of one decode step."""
    steps = RunnerSteps(llm.engine.runner, llm.engine.model_name)
    steps.fill(max(batches) * decode_rates.blocks_per_sequence(steps.block_size, max(contexts)))
    grid: dict[int, dict[int, float]] = {}
    for context in contexts:
        grid[context] = {}
        for batch in batches:
            seconds = decode_rates.step_seconds(steps, batch, context)
            grid[context][batch] = batch / seconds
            print(f"  context {context:>4}, batch {batch:>4}: {seconds * 1e3:8.1f} ms/step, "
                  f"{batch / seconds:7.1f} tok/s", flush=True)
    return grid


def run_offline(llm: LLM, num_prompts: int, seed: int,
                trace: offline_trace.StepTrace | None = None) -> dict[str, Any]:
    """The serving request set, all at once; its output rate and the batch it reached. With
    `trace`, every step of the run (the warm-up's not) is kept in it."""
    rng = random.Random(seed)
    lengths = [rng.randint(16, 128) for _ in range(num_prompts)]
    outputs = [rng.randint(32, 384) for _ in range(num_prompts)]
    prompts = prose_token_ids(llm.engine.tokenize, lengths, seed)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8))  # warm-up
    if trace is not None:
        llm.engine.step_listeners.append(trace)
    try:
        records, wall, generated = run_engine(llm, prompts, outputs)
    finally:
        if trace is not None:
            llm.engine.step_listeners.remove(trace)
    decode_only = [r for r in records if r.num_prefill_tokens == 0 and r.num_decodes > 0]
    return {"requests": num_prompts, "output_tokens": generated, "seconds": round(wall, 2),
            "output_tok_s": round(generated / wall, 1),
            "decode_only_tok_s": round(sum(r.num_decodes for r in decode_only)
                                       / max(sum(r.seconds for r in decode_only), 1e-9), 1),
            "max_batch": max((r.num_decodes for r in records), default=0),
            "max_num_seqs": llm.engine.config.max_num_seqs}


def read_grid(path: Path) -> dict[int, dict[int, float]]:
    """The grid of an earlier sweep.json (context -> batch -> tok/s)."""
    raw = json.loads(path.read_text())["grid"]
    return {int(c): {int(b): float(v) for b, v in row.items()} for c, row in raw.items()}


def table(grid: dict[int, dict[int, float]], offline: dict[str, Any] | None) -> str:
    batches = sorted(next(iter(grid.values())))
    lines = ["| context \\ batch | " + " | ".join(map(str, batches)) + " |",
             "|---|" + "---:|" * len(batches)]
    for context, row in grid.items():
        lines.append(f"| {context} | " + " | ".join(f"{row[b]:,.0f}" for b in batches) + " |")
    text = "Decode output tok/s, one step of synthetic decodes (best of a few):\n\n" + "\n".join(lines) + "\n"
    if offline:
        best = max(max(row.values()) for row in grid.values())
        text += (f"\nOffline, {offline['requests']} requests at once (batch cap {offline['max_num_seqs']}, "
                 f"largest batch {offline['max_batch']}): {offline['output_tok_s']:,.1f} out tok/s overall, "
                 f"{offline['decode_only_tok_s']:,.1f} in decode-only steps; "
                 f"{offline['output_tok_s'] / best:.2f}× the grid's best ({best:,.0f} tok/s).\n")
    return text


def plot(grid: dict[int, dict[int, float]], offline: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for context, row in grid.items():
        ax.plot(list(row), list(row.values()), marker="o", label=f"context {context}")
    if offline:
        ax.axhline(offline["output_tok_s"], color="k", linestyle="--",
                   label=f"offline request set ({offline['requests']} requests)")
    ax.set(xlabel="decode batch", ylabel="output tok/s", xscale="log", title="Decode rate by batch and context")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 192])
    ap.add_argument("--contexts", type=int, nargs="+", default=[100, 300, 600])
    ap.add_argument("--num-prompts", type=int, default=160, help="the offline request set; 0: none")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--quantization", default="auto", help="auto (as pagode serve), none, int8 or int4")
    ap.add_argument("--out", type=Path, default=Path("docs/results/sweep"))
    ap.add_argument("--quick", action="store_true", help="a small grid and 24 requests (a smoke run)")
    ap.add_argument("--trace", type=Path, default=None,
                    help="write every offline step and the split of the run's time against the grid here")
    ap.add_argument("--grid-from", type=Path, default=None, help="the grid of this sweep.json instead of timing one")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="pin the batch cap instead of measuring it")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.contexts, args.num_prompts = [1, 8, 32], [100, 300], min(args.num_prompts, 24)
    # Room for the largest cell: the synthetic decodes wrap around a smaller cache.
    pinned = {} if args.max_num_seqs is None else {"max_num_seqs": args.max_num_seqs}
    llm = LLM(kv_cache_memory="4GiB", max_model_len=1024, kv_cache_dtype=args.kv_cache_dtype,
              quantization=args.quantization, size_batch=args.max_num_seqs is None, **pinned)
    print(f"{cpu_target().describe()}; torch threads {torch.get_num_threads()}; "
          f"quantization {args.quantization}; KV {llm.engine.describe().kv_cache_dtype}", flush=True)
    started = time.perf_counter()
    grid = read_grid(args.grid_from) if args.grid_from else time_grid(llm, args.batches, args.contexts)
    trace = offline_trace.StepTrace() if args.trace else None
    offline = run_offline(llm, args.num_prompts, seed=0, trace=trace) if args.num_prompts else None
    args.out.mkdir(parents=True, exist_ok=True)
    text = f"CPU: {cpu_target().describe()}; quantization {args.quantization}\n\n" + table(grid, offline)
    if trace is not None and args.trace is not None:
        split = offline_trace.decompose(trace.steps, grid, llm.engine.config.max_num_seqs)
        args.trace.parent.mkdir(parents=True, exist_ok=True)
        args.trace.write_text(json.dumps({"grid_from": str(args.grid_from or "this run"), "decomposition": split,
                                          "steps": trace.rows()}, indent=1))
        text += "\n" + offline_trace.summary(split)
    (args.out / "sweep.md").write_text(text)
    (args.out / "sweep.json").write_text(json.dumps(
        {"cpu": cpu_target().describe(), "quantization": args.quantization,
         "grid": {str(c): {str(b): round(v, 1) for b, v in row.items()} for c, row in grid.items()},
         "offline": offline, "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    plot(grid, offline, args.out / "sweep.png")
    print(text)


if __name__ == "__main__":
    main()
