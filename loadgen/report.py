"""The report: results.json with every record, and tables on the terminal."""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from loadgen import __version__
from loadgen.bench import RateResult, Settings, rate_to_json
from loadgen.client import Target
from loadgen.datasets import PromptSet

LATENCIES = (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))


def clean_json(value: Any) -> Any:
    """Strict JSON: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def vllm_run_keys(target: Target, settings: Settings, run: RateResult, created: str) -> dict[str, Any]:
    """One run under `vllm bench serve --save-result`'s names, so that tools for vLLM read it."""
    return {"date": created, "backend": "openai-chat" if target.is_chat else "openai",
            "model_id": target.model, "num_prompts": len(run.records),
            "request_rate": rate_to_json(run.rate), "burstiness": settings.burstiness,
            "max_concurrency": run.concurrency, **run.summary["vllm"]}


def build_results(
    target: Target, settings: Settings, prompts: PromptSet, runs: list[RateResult]
) -> dict[str, Any]:
    settings_json = asdict(settings)
    settings_json["slo"] = settings.slo.to_json() if settings.slo else None
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    vllm_runs = [vllm_run_keys(target, settings, run, created) for run in runs]
    # A single run's vLLM keys also sit at the top level, where vLLM writes them.
    top = vllm_runs[0] if len(runs) == 1 else {}
    return clean_json({
        **top,
        "loadgen_version": __version__,
        "created_utc": created,
        "target": {"url": target.base_url, "endpoint": target.endpoint, "model": target.model},
        "settings": settings_json,
        "dataset": {
            "name": prompts.dataset,
            "num_prompts": len(prompts.prompts),
            "exact_prompt_lengths": prompts.exact,
            "prompts_off_target": prompts.num_off_target,
            "warnings": prompts.warnings,
        },
        "runs": [
            {
                "offered_rate": rate_to_json(run.rate),
                "max_concurrency": run.concurrency,
                "summary": run.summary,
                "vllm": vllm_keys_of_run,
                "server": run.server,
                "timeline": [asdict(s) for s in run.timeline],
                "requests": [r.to_json() for r in run.records],
            }
            for run, vllm_keys_of_run in zip(runs, vllm_runs, strict=True)
        ],
    })


def write_results(out_dir: Path, results: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(results, indent=1, allow_nan=False), encoding="utf-8")
    return path


def load_results(path: Path) -> dict[str, Any]:
    """results.json from a file or from the directory holding it."""
    file = path / "results.json" if path.is_dir() else path
    data: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    return data


def fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def throughput_table(runs: list[dict[str, Any]]) -> Table:
    table = Table(title="Requests and throughput")
    for col in ("offered", "ok", "failed", "duration s", "req/s", "out tok/s", "total tok/s",
                "goodput req/s", "server queue mean ms", "max running srv/client", "preemptions"):
        table.add_column(col, justify="right")
    for run in runs:
        s, srv = run["summary"], run.get("server", {})
        table.add_row(
            str(run["offered_rate"]), str(s["completed"]), str(s["failed"]),
            fmt(s["duration_s"]), fmt(s["request_throughput"], digits=2),
            fmt(s["output_throughput"]), fmt(s["total_token_throughput"]),
            fmt(s.get("goodput"), digits=2), fmt(s.get("queue_time_server_mean_s"), 1e3),
            f'{fmt(srv.get("max_running"), digits=0)} / {s["max_concurrent_streaming"]}',
            fmt(srv.get("preemptions"), digits=0),
        )
    return table


def spec_table(runs: list[dict[str, Any]]) -> Table:
    """Speculative decoding over each run, from the server's counters before and after it."""
    table = Table(title="Speculative decoding (server counters)")
    for col in ("offered", "drafts", "draft tokens", "accepted", "acceptance rate %", "mean acceptance length"):
        table.add_column(col, justify="right")
    for run in runs:
        srv = run.get("server", {})
        table.add_row(str(run["offered_rate"]), fmt(srv.get("spec_drafts"), digits=0),
                      fmt(srv.get("spec_draft_tokens"), digits=0),
                      fmt(srv.get("spec_accepted_tokens"), digits=0),
                      fmt(srv.get("spec_acceptance_rate"), 100, 1),
                      fmt(srv.get("spec_mean_acceptance_length"), digits=2))
    return table


def latency_table(runs: list[dict[str, Any]]) -> Table:
    table = Table(title="Latencies (ms)")
    pcols = [k for k in runs[0]["summary"]["e2e_s"] if k.startswith("p")] if runs else []
    for col in ("offered", "metric", "mean", *pcols, "n"):
        table.add_column(col, justify="right")
    for run in runs:
        for name, key in LATENCIES:
            st = run["summary"][key]
            table.add_row(str(run["offered_rate"]), name, fmt(st["mean"], 1e3),
                          *(fmt(st.get(c), 1e3) for c in pcols), str(st["count"]))
    return table


def print_report(console: Console, results: dict[str, Any]) -> None:
    runs = results["runs"]
    console.print(throughput_table(runs))
    console.print(latency_table(runs))
    if any(run.get("server", {}).get("spec_drafts") is not None for run in runs):
        console.print(spec_table(runs))
    for warning in results["dataset"]["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
    for run in runs:
        for err in run["summary"]["errors"]:
            console.print(f"[red]rate {run['offered_rate']}: {err['count']} x[/] {err['message']}")
