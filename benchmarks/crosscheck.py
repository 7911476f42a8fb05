"""`make crosscheck`: pagode-loadgen and guidellm against the same live `pagode serve`.

Both tools send the same offered Poisson rate, the same number of requests, prompts of
the same token count and exactly the same number of output tokens (`ignore_eos`), to
/v1/completions, after the same two warm-up requests. Their TTFT, ITL and E2E at p50
and p99, and their output tokens/s, are written side by side (JSON and markdown), with
the relative difference of each. guidellm runs from its own virtual environment
(`.venv-crosscheck`, made by the make target); it is no dependency of pagode. It reads
the prompt tokenizer from a copy of the default model's, saved for it, fully offline.

    python -m benchmarks.crosscheck --rate 1 --num-prompts 20 --input-len 64 --output-len 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from benchmarks.pagode_server import REPO_ROOT, running_server
from engine.model.loader import load_tokenizer, resolve_model
from loadgen.bench import Settings
from loadgen.cli import run_loadgen
from loadgen.client import COMPLETIONS_PATH, Target

# (label, loadgen summary key, loadgen stat, guidellm metric, guidellm percentile key, scale to ms)
ROWS = (
    ("TTFT p50 (ms)", "ttft_s", "p50", "time_to_first_token_ms", "p50", 1e3, 1.0),
    ("TTFT p99 (ms)", "ttft_s", "p99", "time_to_first_token_ms", "p99", 1e3, 1.0),
    ("ITL p50 (ms)", "itl_s", "p50", "inter_token_latency_ms", "p50", 1e3, 1.0),
    ("ITL p99 (ms)", "itl_s", "p99", "inter_token_latency_ms", "p99", 1e3, 1.0),
    ("TPOT p50 (ms) vs guidellm ITL p50", "tpot_s", "p50", "inter_token_latency_ms", "p50", 1e3, 1.0),
    ("TPOT p99 (ms) vs guidellm ITL p99", "tpot_s", "p99", "inter_token_latency_ms", "p99", 1e3, 1.0),
    ("E2E p50 (s)", "e2e_s", "p50", "request_latency", "p50", 1.0, 1.0),
    ("E2E p99 (s)", "e2e_s", "p99", "request_latency", "p99", 1.0, 1.0),
)


def save_tokenizer(folder: Path) -> str:
    """The default model's tokenizer as a Hugging Face folder, for guidellm to load offline."""
    load_tokenizer(resolve_model(None)).save_pretrained(str(folder))
    return str(folder)


def warm_up(url: str, model: str) -> None:
    for _ in range(2):
        httpx.post(url + COMPLETIONS_PATH, json={"model": model, "prompt": "Warm up the engine.",
                                                 "max_tokens": 8}, timeout=600).raise_for_status()


def run_guidellm(exe: str, url: str, model: str, tok: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    path = out / "guidellm.json"
    cmd = [exe, "run",
           "--backend", f"kind=openai_http,target={url},model={model},request_format={COMPLETIONS_PATH}",
           "--profile", f"kind=poisson,rate={args.rate}",
           "--constraint", f"kind=max_requests,count={args.num_prompts}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.input_len},output_tokens={args.output_len}",
           "--tokenizer", f"kind=hf_auto,model={tok}",
           "--seed", f"kind=static,value={args.seed}",
           "--output", f"kind=json,path={path}", "--disable-console-interactive"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with (out / "guidellm.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out)
    bench: dict[str, Any] = json.loads(path.read_text())["benchmarks"][0]
    return bench


def guidellm_value(bench: dict[str, Any], metric: str, pkey: str) -> float | None:
    part = bench["metrics"][metric]["successful"]
    return part["percentiles"].get(pkey) if part.get("count") else None


def compare(lg: dict[str, Any], gl: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for label, key, stat, metric, pkey, scale, gscale in ROWS:
        a = lg[key][stat]
        b = guidellm_value(gl, metric, pkey)
        rows.append(row(label, None if a is None else a * scale, None if b is None else b * gscale))
    out_tok = gl["metrics"]["output_token_count"]["successful"]["total_sum"]
    rows.append(row("output tok/s (total / duration)", lg["output_throughput"], out_tok / gl["duration"]))
    rows.append(row("request/s", lg["request_throughput"],
                    gl["metrics"]["request_totals"]["successful"] / gl["duration"]))
    return rows


def row(label: str, a: float | None, b: float | None) -> dict[str, Any]:
    diff = None if a is None or b is None or b == 0 else (a - b) / b
    return {"metric": label, "pagode_loadgen": a, "guidellm": b, "difference": diff,
            "over_10_percent": diff is not None and abs(diff) > 0.10}


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"Rate {args.rate} req/s (Poisson), {args.num_prompts} requests, prompts of {args.input_len} "
             f"tokens, {args.output_len} output tokens (ignore_eos), /v1/completions.", "",
             "| metric | pagode-loadgen | guidellm | difference |", "|---|---:|---:|---:|"]
    for r in rows:
        a, b, d = r["pagode_loadgen"], r["guidellm"], r["difference"]
        lines.append(f"| {r['metric']} | {'-' if a is None else f'{a:,.2f}'} | {'-' if b is None else f'{b:,.2f}'} | "
                     f"{'-' if d is None else f'{d:+.1%}'}{' **>10%**' if r['over_10_percent'] else ''} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.crosscheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1.0)
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--guidellm", default=str(REPO_ROOT / ".venv-crosscheck" / "bin" / "guidellm"))
    p.add_argument("--tokenizer", default=None, help="tokenizer folder for guidellm (default: the default model's)")
    p.add_argument("--server-args", default="", help="extra `pagode serve` flags")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "results" / "crosscheck")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=200)
    with tempfile.TemporaryDirectory(prefix="crosscheck-tokenizer-") as scratch, \
            running_server(args.server_args.split(), args.out / "server.log") as url:
        tok = args.tokenizer or save_tokenizer(Path(scratch))
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        warm_up(url, model)
        settings = Settings(num_prompts=args.num_prompts, input_len=(args.input_len, args.input_len),
                            output_len=(args.output_len, args.output_len), seed=args.seed,
                            ignore_eos=True, show_progress=False)
        _, _, results = asyncio.run(run_loadgen(Target(url, COMPLETIONS_PATH, model), settings,
                                                [args.rate], console))
        gl = run_guidellm(args.guidellm, url, model, tok, args, args.out)
    (args.out / "loadgen_results.json").write_text(json.dumps(results, indent=1))
    rows = compare(results["runs"][0]["summary"], gl)
    (args.out / "crosscheck.json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                                          "rows": rows}, indent=1))
    table = markdown(rows, args)
    (args.out / "crosscheck.md").write_text(table)
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
