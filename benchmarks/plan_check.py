"""`make plan-check`: `pagode plan`'s predictions against a real loadgen run, at two rates.

It starts a `pagode serve` with the engine settings of the step-time fit, measures the
serving overhead the engine's calibration cannot see (SSE writes and this client on the
same cores) with two short probes, asks `pagode plan` (the command a user runs) for the
saturation throughput of the workload with that overhead, then for its predictions at 40%
and 85% of it (or at --rates), replays the same seeded trace at those rates, and writes
predicted and measured output tok/s and TTFT, ITL, TPOT and E2E at p50 and p99 side by
side (JSON and markdown), beside the prediction for the engine alone. The planner draws
its trace with loadgen's own functions (spans.draw_lengths, arrivals.py: same seed, same
lengths and gaps). Without a step-time fit it first runs `pagode plan --calibrate`.

    python -m benchmarks.plan_check --num-prompts 60 --kv-cache-memory 1GiB
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from benchmarks.pagode_server import REPO_ROOT, running_server
from loadgen.bench import Settings
from loadgen.cli import run_loadgen
from loadgen.client import COMPLETIONS_PATH, Target
from loadgen.datasets import parse_range
from loadgen.report import fmt
from planner.overhead import fit_overhead

PROBE_BURSTS = (1, 16)  # requests sent at once by the two overhead probes
PROBE_LENS = ("64", "128")  # their prompt and output tokens
METRICS = (("output tok/s", "output_throughput", None),
           ("TTFT p50 (ms)", "ttft_s", "p50"), ("TTFT p99 (ms)", "ttft_s", "p99"),
           ("ITL p50 (ms)", "itl_s", "p50"), ("ITL p99 (ms)", "itl_s", "p99"),
           ("TPOT p50 (ms)", "tpot_s", "p50"), ("E2E p50 (s)", "e2e_s", "p50"),
           ("E2E p99 (s)", "e2e_s", "p99"))


def plan(args: argparse.Namespace, *extra: str, num_prompts: int | None = None,
         input_len: str | None = None, output_len: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "server.cli", "plan", "--kv-cache-memory", args.kv_cache_memory,
           "--input-len", input_len or args.input_len, "--output-len", output_len or args.output_len,
           "--num-prompts", str(num_prompts or args.num_prompts), "--seed", str(args.seed), *extra]
    if args.fit:
        cmd += ["--fit", str(args.fit)]
    out = subprocess.run(cmd, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout
    if "--json" not in extra:
        return {}
    data: dict[str, Any] = json.loads(out[out.index("{"):])
    return data


def measure_overhead(args: argparse.Namespace, target: Target, console: Console) -> dict[str, Any]:
    """The serving cost per step beyond the engine's, a + b x sequences, from two short probes.

    A burst of 1 and one of 16 requests (64 prompt and 128 output tokens) each decode as one
    batch; the TPOT p50 loadgen measures, minus the one `pagode plan` predicts for the engine
    alone, is the step's overhead at 1 and at 16 sequences. The probes' lengths and sizes differ
    from the checked workload's, so the check still tests the model."""
    points = []
    for n in PROBE_BURSTS:
        predicted = plan(args, "--json", "--rate", "inf", num_prompts=n, input_len=PROBE_LENS[0],
                         output_len=PROBE_LENS[1])["prediction"]["tpot_s"]["p50"]
        settings = Settings(num_prompts=n, input_len=parse_range(PROBE_LENS[0]),
                            output_len=parse_range(PROBE_LENS[1]), seed=args.seed + 1, ignore_eos=True,
                            show_progress=False)
        _, _, res = asyncio.run(run_loadgen(target, settings, [math.inf], console))
        measured = res["runs"][0]["summary"]["tpot_s"]["p50"]
        points.append({"requests": n, "tpot_predicted_s": predicted, "tpot_measured_s": measured})
    per_step, per_seq = fit_overhead([(p["requests"], p["tpot_measured_s"] - p["tpot_predicted_s"])
                                      for p in points])
    return {"per_step_s": per_step, "per_seq_s": per_seq, "probes": points}


def value(summary: dict[str, Any], key: str, stat: str | None) -> float | None:
    v = summary[key] if stat is None else summary[key][stat]
    if v is None:
        return None
    return float(v) * (1e3 if stat is not None and key != "e2e_s" else 1.0)


def error(p: float | None, m: float | None) -> float | None:
    return None if p is None or m is None or m == 0 else (p - m) / m


def compare(predicted: dict[str, Any], measured: dict[str, Any],
            engine_only: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for label, key, stat in METRICS:
        p, m, e = value(predicted, key, stat), value(measured, key, stat), value(engine_only, key, stat)
        rows.append({"metric": label, "predicted": p, "measured": m, "error": error(p, m),
                     "engine_only": e, "engine_only_error": error(e, m)})
    return rows


def percent(v: float | None) -> str:
    return "-" if v is None else f"{v:+.0%}"


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = ["| rate (req/s) | metric | predicted | measured | error | engine alone | its error |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        for r in run["rows"]:
            lines.append(f"| {run['rate']:.3g} | {r['metric']} | {fmt(r['predicted'], digits=2)} | "
                         f"{fmt(r['measured'], digits=2)} | {percent(r['error'])} | "
                         f"{fmt(r['engine_only'], digits=2)} | "
                         f"{percent(r['engine_only_error'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plan_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=60)
    p.add_argument("--input-len", default="16:128")
    p.add_argument("--output-len", default="32:384")
    p.add_argument("--kv-cache-memory", default="1GiB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rates", type=float, nargs=2, default=None,
                   help="the two rates (default: 40%% and 85%% of saturation)")
    p.add_argument("--fit", type=Path, default=None)
    p.add_argument("--calibrate", action="store_true", help="calibrate again even if a fit exists")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "results" / "plan-check")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=200)
    first = plan(args, "--json", "--rate", "inf")
    if args.calibrate or first.get("prediction") is None:
        console.print("calibrating the step-time model (pagode plan --calibrate)...")
        plan(args, "--calibrate")
        first = plan(args, "--json", "--rate", "inf")
    # The server measures its fused-decode limit at load, with the machine's noise; run it
    # with the limit the step-time model was fitted for, so both describe the same engine.
    limit = (first.get("step_model") or {}).get("fused_decode_limit", 0)
    settings = Settings(num_prompts=args.num_prompts, input_len=parse_range(args.input_len),
                        output_len=parse_range(args.output_len), seed=args.seed, ignore_eos=True,
                        show_progress=False)
    server_flags = ["--kv-cache-memory", args.kv_cache_memory]
    if limit:
        server_flags += ["--fused-decode-limit", str(limit)]
    with running_server(server_flags, args.out / "server.log") as url:
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        httpx.post(url + COMPLETIONS_PATH, json={"model": model, "prompt": "Warm up.", "max_tokens": 8},
                   timeout=600).raise_for_status()
        target = Target(url, COMPLETIONS_PATH, model)
        overhead = measure_overhead(args, target, console)
        flag = f"{overhead['per_step_s'] * 1e3:.3f},{overhead['per_seq_s'] * 1e3:.3f}"
        prediction = plan(args, "--json", "--rate", "inf", "--serving-overhead", flag)["prediction"]
        saturation = prediction["request_throughput"]
        console.print(f"serving overhead: {flag} (ms per step, ms per sequence); saturation {saturation:.3f} req/s")
        rates = args.rates or [round(0.40 * saturation, 3), round(0.85 * saturation, 3)]
        engine_only = [plan(args, "--json", "--rate", str(r))["prediction"] for r in rates]
        predictions = [plan(args, "--json", "--rate", str(r), "--serving-overhead", flag)["prediction"]
                       for r in rates]
        _, _, results = asyncio.run(run_loadgen(target, settings, rates, console))
    runs = [{"rate": r, "predicted": pred, "measured": run["summary"],
             "rows": compare(pred, run["summary"], alone)}
            for r, pred, alone, run in zip(rates, predictions, engine_only, results["runs"], strict=True)]
    report = {"saturation_predicted_req_s": saturation, "step_model": first.get("step_model"),
              "fused_decode_limit": limit, "serving_overhead": overhead,
              "settings": {k: str(v) for k, v in vars(args).items()},
              "runs": [{"rate": r["rate"], "rows": r["rows"]} for r in runs]}
    (args.out / "plan_check.json").write_text(json.dumps(report, indent=1))
    (args.out / "loadgen_results.json").write_text(json.dumps(results, indent=1))
    table = markdown(runs)
    (args.out / "plan_check.md").write_text(
        f"Predicted saturation: {saturation:.3f} req/s; {args.num_prompts} requests per rate, prompts "
        f"{args.input_len}, outputs {args.output_len} (ignore_eos), KV {args.kv_cache_memory}; fused decode "
        f"limit {limit}; serving overhead measured by the probes: {flag} (ms per step, ms per sequence). "
        f"'engine alone' predicts without that overhead.\n\n" + table)
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
