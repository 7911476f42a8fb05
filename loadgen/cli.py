"""pagode-loadgen: the command line.

    pagode-loadgen --url URL --rate R [R2 ...] --num-prompts N [options]
    pagode-loadgen compare DIR1 DIR2 ...
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from loadgen.bench import Settings, discover_model, make_http_client, prepare_prompts, run_rate
from loadgen.client import CHAT_PATH, COMPLETIONS_PATH, Target
from loadgen.compare import run_compare
from loadgen.datasets import PromptSet, parse_range
from loadgen.metrics import PERCENTILES, parse_percentiles, parse_slo
from loadgen.plots import plot_results
from loadgen.report import build_results, print_report, write_results
from loadgen.sweep import bisect_capacity


def parse_rate(text: str) -> float:
    rate = math.inf if text.lower() in {"inf", "infinity"} else float(text)
    if not rate > 0:
        raise argparse.ArgumentTypeError("rate must be > 0, or inf")
    return rate


def normalize_url(url: str) -> str:
    """The server root: a trailing /v1 is dropped, since endpoints carry it."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pagode-loadgen",
        description="Replay a seeded Poisson (Gamma) trace against an OpenAI-compatible server "
        "and report TTFT, ITL, TPOT and E2E as `vllm bench serve` defines them. "
        "`pagode-loadgen compare DIR1 DIR2 ...` compares saved runs.",
    )
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--endpoint", default=COMPLETIONS_PATH, choices=[COMPLETIONS_PATH, CHAT_PATH])
    p.add_argument("--rate", type=parse_rate, nargs="+", default=[math.inf],
                   help="offered request rate(s) per second; several are swept in order; inf sends all at once")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="Gamma shape of the gaps; 1 is Poisson, <1 burstier, >1 more regular")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=None,
                   help="cap(s) on requests in flight; several are swept in order; with the "
                   "default rate inf each is a closed loop at that fixed concurrency")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dataset", default="text", help="text[:PATH] | random | sharegpt:PATH "
                   "(real answer lengths) | shared-system[:TOKENS] | multiturn[:TURNS]")
    p.add_argument("--input-len", type=parse_range, default=(16, 128), help="prompt tokens MIN:MAX")
    p.add_argument("--output-len", type=parse_range, default=(32, 384), help="output tokens MIN:MAX")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly the requested tokens")
    p.add_argument("--slo", type=parse_slo, default=None,
                   help="goodput objectives, e.g. ttft=500,itl=50,e2e=10 (ms, ms, s); "
                   "itl bounds each request's mean gap between tokens (TPOT)")
    p.add_argument("--percentiles", type=parse_percentiles, default=PERCENTILES,
                   help="latency percentiles to report, e.g. 50,90,99,99.9 (default: 50,90,99)")
    p.add_argument("--sweep", action="store_true",
                   help="find the highest rate meeting --slo by bisection, starting at the first --rate")
    p.add_argument("--slo-attainment", type=float, default=0.99,
                   help="with --sweep: the fraction of requests that must meet --slo")
    p.add_argument("--sweep-max-runs", type=int, default=8, help="with --sweep: most runs to spend")
    p.add_argument("--out", type=Path, default=Path("results/loadgen"), help="output directory")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds of silence before a request fails")
    p.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between /metrics scrapes")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    return p


def settings_from_args(args: argparse.Namespace) -> Settings:
    if args.num_prompts < 1:
        raise SystemExit("--num-prompts must be >= 1")
    return Settings(
        num_prompts=args.num_prompts, dataset=args.dataset, input_len=args.input_len,
        output_len=args.output_len, burstiness=args.burstiness,
        max_concurrency=args.max_concurrency[0] if args.max_concurrency else None, seed=args.seed,
        ignore_eos=args.ignore_eos,
        slo=args.slo, timeout=args.timeout, scrape_interval=args.scrape_interval,
        show_progress=not args.no_progress, percentiles=args.percentiles,
    )


@dataclass(frozen=True)
class SweepSpec:
    attainment: float = 0.99
    max_runs: int = 8


async def run_loadgen(
    target: Target, settings: Settings, rates: Sequence[float], console: Console,
    prompts: PromptSet | None = None, concurrencies: Sequence[int | None] = (None,),
    sweep: SweepSpec | None = None,
) -> tuple[Target, PromptSet, dict[str, Any]]:
    """Prepare the prompts (unless given), replay them at each rate and concurrency (or
    bisect the rate with `sweep`), return results.json's content."""
    async with make_http_client(settings.timeout, target.headers()) as http:
        if target.model is None:
            target = Target(target.base_url, target.endpoint,
                            await discover_model(http, target.base_url), target.api_key)
        if prompts is None:
            prompts = await prepare_prompts(http, target, settings)
        for warning in prompts.warnings:
            console.print(f"[yellow]warning:[/] {warning}")
        specs = prompts.prompts
        runs = []
        sweep_result = None
        if sweep is not None:
            if settings.slo is None:
                raise SystemExit("--sweep needs --slo")

            async def attain(rate: float) -> float:
                run = await run_rate(http, target, specs, rate, settings, console)
                runs.append(run)
                return float(run.summary["good_requests"]) / max(1, run.summary["num_requests"])

            sweep_result = await bisect_capacity(attain, rates[0], sweep.attainment, max_runs=sweep.max_runs)
        else:
            for c in concurrencies:
                for r in rates:
                    runs.append(await run_rate(http, target, specs, r, settings, console, c))
    results = build_results(target, settings, prompts, runs)
    if sweep_result is not None and sweep is not None:
        results["sweep"] = {"slo": settings.slo.to_json() if settings.slo else None,
                            "attainment_target": sweep.attainment, **sweep_result.to_json()}
        cap = sweep_result.capacity
        console.print(f"capacity at this SLO: {'none found' if cap is None else f'{cap:.3g} req/s'}")
    return target, prompts, results


def make_console() -> Console:
    # Piped into a file or a log, the wide tables must not be cut to 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=220)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    console = make_console()
    if argv[:1] == ["compare"]:
        return run_compare(argv[1:], console)
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)
    target = Target(normalize_url(args.url), args.endpoint, args.model, args.api_key)
    concurrencies = args.max_concurrency or [None]
    sweep = SweepSpec(args.slo_attainment, args.sweep_max_runs) if args.sweep else None
    _, _, results = asyncio.run(run_loadgen(target, settings, args.rate, console,
                                            concurrencies=concurrencies, sweep=sweep))
    path = write_results(args.out, results)
    print_report(console, results)
    if not args.no_plots:
        plot_results(results, args.out)
    console.print(f"results: {path}")
    completed = sum(run["summary"]["completed"] for run in results["runs"])
    return 0 if completed else 1


if __name__ == "__main__":
    raise SystemExit(main())
