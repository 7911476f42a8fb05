"""`make plan-check`: `pagode plan`'s predictions against a real loadgen run, at two rates.

It asks `pagode plan` (a subprocess: loadgen never imports the engine) for the saturation
throughput of the workload, then for its predictions at 40% and 85% of it (or at
--rates), replays the same seeded trace at those rates against a live `pagode serve`
with the same engine settings, and writes predicted and measured output tok/s and TTFT,
ITL, TPOT and E2E at p50 and p99 side by side (JSON and markdown). The planner draws its
trace exactly as loadgen's `text` dataset and arrivals do (same seed, same lengths).
Without a step-time fit it first runs `pagode plan --calibrate`.

    python -m loadgen.plan_check --num-prompts 60 --kv-cache-memory 1GiB
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from loadgen.bench import Settings
from loadgen.cli import run_loadgen
from loadgen.client import COMPLETIONS_PATH, Target
from loadgen.datasets import parse_range
from loadgen.server_process import REPO_ROOT, running_server

METRICS = (("output tok/s", "output_throughput", None),
           ("TTFT p50 (ms)", "ttft_s", "p50"), ("TTFT p99 (ms)", "ttft_s", "p99"),
           ("ITL p50 (ms)", "itl_s", "p50"), ("ITL p99 (ms)", "itl_s", "p99"),
           ("TPOT p50 (ms)", "tpot_s", "p50"), ("E2E p50 (s)", "e2e_s", "p50"),
           ("E2E p99 (s)", "e2e_s", "p99"))


def plan(args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "server.cli", "plan", "--kv-cache-memory", args.kv_cache_memory,
           "--input-len", args.input_len, "--output-len", args.output_len,
           "--num-prompts", str(args.num_prompts), "--seed", str(args.seed), *extra]
    if args.fit:
        cmd += ["--fit", str(args.fit)]
    out = subprocess.run(cmd, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout
    if "--json" not in extra:
        return {}
    data: dict[str, Any] = json.loads(out[out.index("{"):])
    return data


def value(summary: dict[str, Any], key: str, stat: str | None) -> float | None:
    v = summary[key] if stat is None else summary[key][stat]
    if v is None:
        return None
    return float(v) * (1e3 if stat is not None and key != "e2e_s" else 1.0)


def compare(predicted: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for label, key, stat in METRICS:
        p, m = value(predicted, key, stat), value(measured, key, stat)
        err = None if p is None or m is None or m == 0 else (p - m) / m
        rows.append({"metric": label, "predicted": p, "measured": m, "error": err})
    return rows


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = ["| rate (req/s) | metric | predicted | measured | error |", "|---:|---|---:|---:|---:|"]
    for run in runs:
        for r in run["rows"]:
            p, m, e = r["predicted"], r["measured"], r["error"]
            lines.append(f"| {run['rate']:.3g} | {r['metric']} | {'-' if p is None else f'{p:,.2f}'} | "
                         f"{'-' if m is None else f'{m:,.2f}'} | {'-' if e is None else f'{e:+.0%}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.plan_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=60)
    p.add_argument("--input-len", default="16:128")
    p.add_argument("--output-len", default="32:384")
    p.add_argument("--kv-cache-memory", default="1GiB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rates", type=float, nargs=2, default=None, help="the two rates (default: 40%% and 85%% of saturation)")
    p.add_argument("--fit", type=Path, default=None)
    p.add_argument("--calibrate", action="store_true", help="calibrate again even if a fit exists")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "plan-check")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=200)
    first = plan(args, "--json", "--rate", "inf")
    if args.calibrate or first.get("prediction") is None:
        console.print("calibrating the step-time model (pagode plan --calibrate)...")
        plan(args, "--calibrate")
        first = plan(args, "--json", "--rate", "inf")
    saturation = first["prediction"]["request_throughput"]
    rates = args.rates or [round(0.40 * saturation, 3), round(0.85 * saturation, 3)]
    predictions = [plan(args, "--json", "--rate", str(r))["prediction"] for r in rates]
    settings = Settings(num_prompts=args.num_prompts, input_len=parse_range(args.input_len),
                        output_len=parse_range(args.output_len), seed=args.seed, ignore_eos=True,
                        show_progress=False)
    with running_server(["--kv-cache-memory", args.kv_cache_memory], args.out / "server.log") as url:
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        httpx.post(url + COMPLETIONS_PATH, json={"model": model, "prompt": "Warm up.", "max_tokens": 8},
                   timeout=600).raise_for_status()
        _, _, results = asyncio.run(run_loadgen(Target(url, COMPLETIONS_PATH, model), settings, rates, console))
    runs = [{"rate": r, "predicted": pred, "measured": run["summary"],
             "rows": compare(pred, run["summary"])}
            for r, pred, run in zip(rates, predictions, results["runs"], strict=True)]
    report = {"saturation_predicted_req_s": saturation, "step_model": first.get("step_model"),
              "settings": {k: str(v) for k, v in vars(args).items()},
              "runs": [{"rate": r["rate"], "rows": r["rows"]} for r in runs]}
    (args.out / "plan_check.json").write_text(json.dumps(report, indent=1))
    (args.out / "loadgen_results.json").write_text(json.dumps(results, indent=1))
    table = markdown(runs)
    (args.out / "plan_check.md").write_text(
        f"Predicted saturation: {saturation:.3f} req/s; {args.num_prompts} requests per rate, prompts "
        f"{args.input_len}, outputs {args.output_len} (ignore_eos), KV {args.kv_cache_memory}.\n\n" + table)
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
