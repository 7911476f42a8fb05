"""`make experiment-cache`: the source article's second experiment, the size of the KV cache at
overload, with fp16 and int8 KV.

    python -m benchmarks.cache_experiment [--sizes 256MiB,1GiB] [--kv-dtypes fp16,int8]
        [--rate 4.0] [--num-prompts 120] [--out docs/results/experiment-cache]

Each (cache size, KV dtype) gets its own `pagode serve --batching paged` with the
experiment's context (`--max-model-len 512`, blocks of 16) and otherwise the shipped
defaults, and replays the same seeded Poisson trace above the server's capacity. The
article's point: a smaller cache costs throughput and tail latency only where memory, not
compute, limits the batch; int8 KV holds about twice the positions of fp16 in the same bytes,
so it moves that limit. Writes results.json, summary.md and a bar plot into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.experiment import MAX_MODEL_LEN, row_values
from benchmarks.pagode_server import running_server
from loadgen.bench import Settings
from loadgen.cli import make_console, run_loadgen
from loadgen.client import Target
from loadgen.datasets import PromptSet
from loadgen.plots import save
from loadgen.report import fmt


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cache_experiment", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="256MiB,1GiB", type=lambda v: v.split(","))
    p.add_argument("--kv-dtypes", default="fp16,int8", type=lambda v: v.split(","))
    p.add_argument("--rate", type=float, default=4.0, help="req/s, above the server's capacity")
    p.add_argument("--num-prompts", type=int, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=Path("docs/results/experiment-cache"))
    return p


def run_config(args: argparse.Namespace, size: str, dtype: str, prompts: PromptSet | None,
               console: Any) -> tuple[PromptSet, dict[str, Any]]:
    """One server at one cache size and KV dtype, the overload trace; its scraped capacity too."""
    server = ["--batching", "paged", "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory", size,
              "--kv-cache-dtype", dtype, "--disable-access-log"]
    settings = Settings(num_prompts=args.num_prompts, input_len=(16, 128), output_len=(32, 384), seed=args.seed,
                        ignore_eos=True, scrape_interval=0.5, show_progress=True)
    console.rule(f"KV cache {size}, {dtype}")
    with running_server(server, args.out / f"server-{size}-{dtype}.log", args.startup_timeout) as url:
        _, prompts, results = asyncio.run(run_loadgen(Target(url), settings, [args.rate], console, prompts))
    run = results["runs"][0]
    return prompts, {"size": size, "kv_dtype": dtype, "values": row_values(run), "summary": run["summary"],
                     "kv_tokens": kv_tokens(args.out / f"server-{size}-{dtype}.log")}


def kv_tokens(log: Path) -> int | None:
    """The positions the server's cache holds, from its start-up line."""
    for line in log.read_text(errors="replace").splitlines():
        if "KV blocks of" in line and "tokens)" in line:
            return int(line.split(" tokens)")[0].rsplit("(", 1)[1].replace(",", ""))
    return None


def summary(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"Overload: {args.num_prompts} requests at {args.rate} req/s (Poisson, seed {args.seed}), prompts "
             "16-128 tokens, outputs 32-384 with ignore_eos, `--batching paged --max-model-len 512`.", "",
             "| KV cache | KV dtype | positions held | req/s | out tok/s | TTFT p50 (s) | ITL p50 / p99 (ms) "
             "| E2E p99 (s) | max running | preemptions |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        v = r["values"]
        lines.append(f"| {r['size']} | {r['kv_dtype']} | {fmt(r['kv_tokens'], digits=0)} | {fmt(v['req/s'], digits=2)} "
                     f"| {fmt(v['out tok/s'])} | {fmt(v['TTFT p50'], digits=2)} "
                     f"| {fmt(v['ITL p50'], 1e3)} / {fmt(v['ITL p99'], 1e3)} | {fmt(v['E2E p99'], digits=1)} "
                     f"| {fmt(v['max running'], digits=0)} | {fmt(v['preemptions'], digits=0)} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib.pyplot as plt

    labels = [f"{r['size']}\n{r['kv_dtype']}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, (key, title, scale) in zip(axes, (("out tok/s", "output tokens/s", 1.0), ("E2E p99", "E2E p99 (s)", 1.0),
                                              ("max running", "max concurrent seqs", 1.0)), strict=True):
        ax.bar(labels, [(r["values"][key] or 0.0) * scale for r in rows])
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    return save(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    console = make_console()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    prompts: PromptSet | None = None
    for size in args.sizes:
        for dtype in args.kv_dtypes:
            prompts, row = run_config(args, size, dtype, prompts, console)
            rows.append(row)
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    text = summary(rows, args)
    (args.out / "summary.md").write_text(text)
    plot(rows, args.out / "summary_bars.png")
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
