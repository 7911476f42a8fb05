"""`make experiment`: static batches, continuous batching and a paged KV cache, side by side
under the same seeded Poisson trace.

    python -m benchmarks.experiment [--batching static,continuous,paged] [--low-rate R]
        [--high-rate R] [--num-prompts N] [--kv-cache-memory BYTES] [--out docs/results/experiment]

For each batching mode it starts `pagode serve --batching B --max-model-len 512 --block-size 16
--watermark 0.1`, with a KV budget sized so that `static` and `continuous` (which
reserve the whole context per sequence) fit about 64 sequences; replays the same
seeded trace at a low load and at an overload; stops the server; then writes
results.json, summary.md and PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.pagode_server import running_server
from loadgen.bench import Settings
from loadgen.cli import make_console, run_loadgen
from loadgen.client import Target
from loadgen.datasets import PromptSet, parse_range
from loadgen.plots import plot_cdfs, plot_timelines, save
from loadgen.report import clean_json, fmt, write_results

# SmolLM2-135M: 30 layers x 3 KV heads x 64 dims, K and V, fp16 (pinned on the server, so
# that the budget holds SEQS_RESERVED x MAX_MODEL_LEN positions whatever the default).
KV_CACHE_DTYPE = "fp16"
BYTES_PER_POSITION = 2 * 30 * 3 * 64 * 2  # 23040
SEQS_RESERVED = 64
MAX_MODEL_LEN = 512
DEFAULT_KV_BYTES = SEQS_RESERVED * MAX_MODEL_LEN * BYTES_PER_POSITION  # 754974720
LOADS = ("low", "high")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.experiment", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batching", default="static,continuous,paged",
                   help="batching modes, comma-separated, run in this order")
    p.add_argument("--low-rate", type=float, default=0.4, help="req/s every batching mode keeps up with")
    p.add_argument("--high-rate", type=float, default=4.0, help="req/s above the paged server's capacity")
    p.add_argument("--num-prompts", type=int, default=200, help="requests per load")
    p.add_argument("--loads", default="low,high", type=lambda v: [x for x in v.split(",") if x],
                   help="which loads to run: low, high or both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--input-len", type=parse_range, default=(16, 128))
    p.add_argument("--output-len", type=parse_range, default=(32, 384))
    p.add_argument("--kv-cache-memory", default=str(DEFAULT_KV_BYTES),
                   help=f"bytes (default {DEFAULT_KV_BYTES}: {SEQS_RESERVED} sequences of "
                   f"{MAX_MODEL_LEN} positions at {BYTES_PER_POSITION} B each)")
    p.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--watermark", type=float, default=0.1)
    p.add_argument("--model", default=None, help="passed to the server (default: its own)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra argument for `pagode serve`, repeatable, e.g. --server-arg=--max-num-seqs=512")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--scrape-interval", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=Path("docs/results/experiment"))
    p.add_argument("--raw-out", type=Path, default=Path("results/experiment"),
                   help="full per-request records with every event time (not for docs/)")
    p.add_argument("--no-progress", action="store_true")
    return p


def server_args(args: argparse.Namespace, batching: str) -> list[str]:
    extra = ["--model", args.model] if args.model else []
    return ["--batching", batching, "--max-model-len", str(args.max_model_len),
            "--block-size", str(args.block_size), "--watermark", str(args.watermark),
            "--kv-cache-memory", str(args.kv_cache_memory), "--kv-cache-dtype", KV_CACHE_DTYPE,
            *extra, *args.server_arg]


def run_batching(
    args: argparse.Namespace, batching: str, settings: Settings, prompts: PromptSet | None,
    console: Console,
) -> tuple[PromptSet, dict[str, Any]]:
    """One server, both loads; the prompts are cut once and reused for every batching mode."""
    log = args.raw_out / f"server_{batching}.log"
    console.rule(f"batching {batching}")
    with running_server(server_args(args, batching), log, args.startup_timeout) as url:
        rates = [args.low_rate if load == "low" else args.high_rate for load in args.loads]
        _, prompts, results = asyncio.run(run_loadgen(Target(url), settings, rates, console, prompts))
    for run, load in zip(results["runs"], args.loads, strict=True):
        run["load"] = load
    return prompts, results


def compact(results: dict[str, Any]) -> dict[str, Any]:
    """Per-request records without their event times, to keep docs/ small."""
    out = json.loads(json.dumps(results))
    for run in out["runs"]:
        for rec in run["requests"]:
            times = rec.pop("content_times")
            rec["num_content_events"] = len(times)
            rec["max_itl"] = max((b - a for a, b in zip(times, times[1:], strict=False)), default=None)
    return out


def row_values(run: dict[str, Any]) -> dict[str, float | None]:
    s, srv = run["summary"], run["server"]
    return {
        "req/s": s["request_throughput"], "out tok/s": s["output_throughput"],
        "TTFT p50": s["ttft_s"]["p50"], "TTFT p99": s["ttft_s"]["p99"],
        "ITL p50": s["itl_s"]["p50"], "ITL p99": s["itl_s"]["p99"],
        "E2E p50": s["e2e_s"]["p50"], "E2E p99": s["e2e_s"]["p99"],
        "max running": srv.get("max_running"), "preemptions": srv.get("preemptions"),
        "max streaming": s.get("max_concurrent_streaming"),
        "queue mean": s.get("queue_time_server_mean_s"),
    }


def get(results: dict[str, dict[str, Any]], batching: str, load: str) -> dict[str, Any] | None:
    for run in results.get(batching, {}).get("runs", []):
        if run.get("load") == load:
            return run
    return None


def summary_table(results: dict[str, dict[str, Any]]) -> list[str]:
    head = ("| batching | load | offered req/s | ok / failed | req/s | out tok/s | TTFT p50 / p99 (ms) "
            "| ITL p50 / p99 (ms) | E2E p50 / p99 (s) | max concurrent seqs (scraped / client) | preemptions "
            "| server queue mean (s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for batching in results:
        for load in LOADS:
            run = get(results, batching, load)
            if run is None:
                continue
            v, s = row_values(run), run["summary"]
            lines.append(
                f"| {batching} | {load} | {run['offered_rate']} | {s['completed']} / {s['failed']} "
                f"| {fmt(v['req/s'], digits=2)} | {fmt(v['out tok/s'])} "
                f"| {fmt(v['TTFT p50'], 1e3)} / {fmt(v['TTFT p99'], 1e3)} "
                f"| {fmt(v['ITL p50'], 1e3)} / {fmt(v['ITL p99'], 1e3)} "
                f"| {fmt(v['E2E p50'], digits=2)} / {fmt(v['E2E p99'], digits=2)} "
                f"| {fmt(v['max running'], digits=0)} / {fmt(v['max streaming'], digits=0)} "
                f"| {fmt(v['preemptions'], digits=0)} "
                f"| {fmt(v['queue mean'], digits=2)} |")
    return lines


def value(results: dict[str, dict[str, Any]], batching: str, load: str, key: str) -> float | None:
    run = get(results, batching, load)
    return row_values(run)[key] if run else None


def div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def key_ratios(results: dict[str, dict[str, Any]]) -> list[str]:
    """What paging and continuous batching change, as sentences with numbers: throughput and
    tail latency under overload, and the wait a static batch imposes at low load."""
    v = lambda p, load, k: value(results, p, load, k)  # noqa: E731 - a local shorthand
    ratio = lambda a, b, load, k: fmt(div(v(a, load, k), v(b, load, k)), digits=2)  # noqa: E731
    out = [
        f"- Overload throughput, paged / static: x{ratio('paged', 'static', 'high', 'req/s')} "
        f"requests/s, x{ratio('paged', 'static', 'high', 'out tok/s')} output tokens/s "
        f"(continuous / static: x{ratio('continuous', 'static', 'high', 'req/s')}).",
        f"- Overload p99 E2E, static / paged: x{ratio('static', 'paged', 'high', 'E2E p99')} "
        f"({fmt(v('static', 'high', 'E2E p99'), digits=2)} s vs {fmt(v('paged', 'high', 'E2E p99'), digits=2)} s).",
        "- Overload p99 ITL: " + ", ".join(
            f"{p} {fmt(v(p, 'high', 'ITL p99'), 1e3)} ms" for p in results) + ".",
        "- Max concurrent sequences under overload (scraped / client-side): " + ", ".join(
            f"{p} {fmt(v(p, 'high', 'max running'), digits=0)} / {fmt(v(p, 'high', 'max streaming'), digits=0)}"
            for p in results) + ".",
        f"- Low-load p99 TTFT: static {fmt(v('static', 'low', 'TTFT p99'), 1e3)} ms vs continuous "
        f"{fmt(v('continuous', 'low', 'TTFT p99'), 1e3)} ms "
        f"(x{fmt(div(v('static', 'low', 'TTFT p99'), v('continuous', 'low', 'TTFT p99')), digits=1)}).",
    ]
    return out


def reserved_seqs(args: argparse.Namespace) -> str:
    """How many whole-context reservations the KV budget holds, for a bytes budget."""
    kv = str(args.kv_cache_memory)
    return str(int(kv) // (args.max_model_len * BYTES_PER_POSITION)) if kv.isdigit() else "?"


def lagging_modes(results: dict[str, dict[str, Any]], load: str = "low") -> list[str]:
    """Batching modes whose completions fell clearly behind the offered rate at this load."""
    runs = {p: get(results, p, load) for p in results}
    return [
        p for p, run in runs.items()
        if run and isinstance(run["offered_rate"], int | float)
        and run["summary"]["request_throughput"] < 0.85 * run["offered_rate"]
    ]


def queue_means(results: dict[str, dict[str, Any]], load: str = "low") -> str:
    parts = []
    for batching in results:
        run = get(results, batching, load)
        mean = run["summary"].get("queue_time_server_mean_s") if run else None
        parts.append(f"{batching} {fmt(mean)} s")
    return ", ".join(parts)


def write_summary(out: Path, args: argparse.Namespace, results: dict[str, dict[str, Any]]) -> Path:
    first = next(iter(results.values()))
    lines = [
        "# Three ways of serving: static batches, continuous batching, paged KV cache",
        "",
        f"Model: `{first['target']['model']}`; {os.cpu_count()} CPU cores; "
        f"`--max-model-len {args.max_model_len} --block-size {args.block_size} "
        f"--watermark {args.watermark} --kv-cache-memory {args.kv_cache_memory}` "
        f"({reserved_seqs(args)} sequences of {args.max_model_len} positions for static/continuous).",
        f"Trace: {args.num_prompts} requests per load, seed {args.seed}, Poisson arrivals, "
        f"prompts of {args.input_len[0]}-{args.input_len[1]} tokens of prose (cut with the server's "
        f"/tokenize: {'exact' if first['dataset']['exact_prompt_lengths'] else 'ESTIMATED'}), "
        f"outputs of {args.output_len[0]}-{args.output_len[1]} tokens with ignore_eos; "
        f"low load {args.low_rate} req/s, overload {args.high_rate} req/s.",
        "",
        "Latencies as `vllm bench serve` defines them; max concurrent sequences is the largest "
        "`pagode:num_requests_running` scraped (every "
        f"{args.scrape_interval} s), then the most requests streaming tokens at once as the client "
        "saw them (first token to last event); preemptions is the `pagode:num_preemptions_total` delta.",
        "",
        *summary_table(results),
        "",
        "## Key ratios",
        "",
        *key_ratios(results),
        "",
        *([f"**Warning**: at the low load, {', '.join(lag)} completed clearly fewer requests/s "
           "than offered (req/s counts the drain of the last requests too); the server's mean "
           f"queue time tells whether the queue grew: {queue_means(results)}. Where it did, that "
           "load is not one that batching mode keeps up with; lower --low-rate.", ""]
          if (lag := lagging_modes(results)) else []),
        f"Reproduce: `python -m benchmarks.experiment {' '.join(args.argv)}`".rstrip(),
    ]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def plot_bars(results: dict[str, dict[str, Any]], path: Path) -> Path:
    import matplotlib.pyplot as plt
    import numpy as np

    modes = list(results)
    panels = (("req/s", "completed req/s", 1.0), ("out tok/s", "output tokens/s", 1.0),
              ("TTFT p99", "TTFT p99 (s)", 1.0), ("ITL p99", "ITL p99 (ms)", 1e3),
              ("E2E p99", "E2E p99 (s)", 1.0), ("max running", "max concurrent seqs", 1.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8))
    x = np.arange(len(modes))
    for ax, (key, title, scale) in zip(axes, panels, strict=True):
        for k, load in enumerate(LOADS):
            ys = [(value(results, p, load, key) or math.nan) * scale for p in modes]
            ax.bar(x + (k - 0.5) * 0.38, ys, width=0.38, label=f"{load} load")
        ax.set_xticks(x, modes)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    return save(fig, path)


def write_outputs(args: argparse.Namespace, results: dict[str, dict[str, Any]], console: Console) -> None:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    doc = {"experiment": clean_json({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}),
           "batching": {b: compact(r) for b, r in results.items()}}
    (out / "results.json").write_text(json.dumps(doc, indent=1, allow_nan=False), encoding="utf-8")
    for batching, res in results.items():
        write_results(args.raw_out / batching, res)
    for load in args.loads:
        labeled = [(p, run) for p in results if (run := get(results, p, load))]
        plot_cdfs(labeled, out / f"latency_cdf_{load}.png")
        plot_timelines(labeled, out / f"server_timeline_{load}.png")
    plot_bars(results, out / "summary_bars.png")
    summary = write_summary(out, args, results)
    console.print(summary.read_text(), markup=False, highlight=False, soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # quoted in summary.md, to reproduce the run
    console = make_console()
    modes = [b.strip() for b in args.batching.split(",") if b.strip()]
    settings = Settings(
        num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
        seed=args.seed, ignore_eos=True, scrape_interval=args.scrape_interval,
        show_progress=not args.no_progress,
    )
    if not set(args.loads) <= set(LOADS):
        raise SystemExit(f"--loads takes {', '.join(LOADS)}")
    floor = sum(args.num_prompts / (args.low_rate if load == "low" else args.high_rate)
                for load in args.loads)
    console.print(f"{len(modes)} batching modes; arrivals alone take about {floor / 60:.0f} min per mode")
    results: dict[str, dict[str, Any]] = {}
    prompts: PromptSet | None = None
    failed: list[str] = []
    for batching in modes:
        try:
            prompts, results[batching] = run_batching(args, batching, settings, prompts, console)
        except (RuntimeError, TimeoutError, OSError) as exc:  # one broken server: go on
            console.print(f"[red]batching {batching} failed:[/] {exc}")
            failed.append(batching)
            continue
        write_outputs(args, results, console)  # after each mode: a crash keeps what was measured
    if failed:
        console.print(f"[red]failed batching modes: {', '.join(failed)}[/] (logs in {args.raw_out})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
