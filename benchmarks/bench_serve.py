"""`make bench-serve`: a steady serving load against a live `pagode serve`.

    python -m benchmarks.bench_serve [--quantization none] [--kv-cache-dtype auto]
                                     [--server-arg=--max-num-batched-tokens=256 ...] [--out FILE]

Starts `pagode serve` on a free loopback port, replays a seeded Poisson trace (rate
2 req/s, 60 requests, prompts of 16-128 tokens of prose, outputs of 32-384 tokens with
ignore_eos, streamed) with pagode-loadgen's client, stops the server, writes one JSON and
prints output tok/s and TTFT/ITL/E2E p50/p99. The server runs as its own process, measured from
the outside, as a client sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from benchmarks.pagode_server import running_server
from loadgen.bench import Settings
from loadgen.cli import make_console, run_loadgen
from loadgen.client import Target

RATE, NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN, SEED = 2.0, 60, (16, 128), (32, 384), 0


def server_args(args: argparse.Namespace) -> list[str]:
    extra = ["--quantization", args.quantization] if args.quantization else []
    return ["--kv-cache-memory", args.kv_cache_memory, "--kv-cache-dtype", args.kv_cache_dtype,
            "--disable-access-log", *extra, *args.server_arg]


def headline(run: dict[str, Any]) -> dict[str, Any]:
    s = run["summary"]
    return {"out_tok_s": s["output_throughput"], "completed": s["completed"], "failed": s["failed"],
            **{f"{name}_{q}_s": s[f"{name}_s"][q] for name in ("ttft", "itl", "e2e") for q in ("p50", "p99")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quantization", default=None, help="passed to pagode serve when given")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--kv-cache-memory", default="1GiB")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra pagode serve argument, e.g. --server-arg=--max-num-batched-tokens=256")
    ap.add_argument("--num-prompts", type=int, default=NUM_PROMPTS)
    ap.add_argument("--rate", type=float, default=RATE)
    ap.add_argument("--out", type=Path, default=Path("results/bench-serve.json"))
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    console = make_console()
    settings = Settings(num_prompts=args.num_prompts, input_len=INPUT_LEN, output_len=OUTPUT_LEN,
                        seed=SEED, ignore_eos=True, show_progress=False)
    log = args.out.with_suffix(".server.log")
    with running_server(server_args(args), log, args.startup_timeout) as url:
        _, _, results = asyncio.run(run_loadgen(Target(url), settings, [args.rate], console))
    run = results["runs"][0]
    report = {"workload": {"rate": args.rate, "num_prompts": args.num_prompts, "input_len": INPUT_LEN,
                           "output_len": OUTPUT_LEN, "ignore_eos": True, "stream": True, "seed": SEED},
              "server_args": server_args(args), **headline(run), "summary": run["summary"],
              "server": run.get("server", {})}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    h = headline(run)
    print(f"{' '.join(server_args(args))}: {h['out_tok_s']:.1f} out tok/s, {h['completed']} completed, "
          f"{h['failed']} failed\n  TTFT p50/p99 {h['ttft_p50_s']:.3f}/{h['ttft_p99_s']:.3f} s  "
          f"ITL p50/p99 {h['itl_p50_s'] * 1e3:.1f}/{h['itl_p99_s'] * 1e3:.1f} ms  "
          f"E2E p50/p99 {h['e2e_p50_s']:.1f}/{h['e2e_p99_s']:.1f} s\n  {args.out}")
    return 0 if h["completed"] == args.num_prompts else 1


if __name__ == "__main__":
    raise SystemExit(main())
