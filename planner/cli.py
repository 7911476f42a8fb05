"""`pagode plan`: the flags and the report (server/cli.py only dispatches here).

    pagode plan [MODEL | --model M] [--revision R] [--kv-cache-memory 4GiB] [--kv-cache-dtype fp16]
                [--quantization int8] [--input-len 16:128] [--output-len 32:384]
                [--rate 2] [--slo ttft=2000,itl=200] [--json]
    pagode plan --calibrate [--fit PATH]

MODEL is what `pagode serve` takes: a local path, or a hub name (ORG/REPO, ORG/REPO:QUANT)
fetched through the same hub code into the hub cache, and read from the cache with no network
once it is there (engine/model/hub.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from engine.arg_utils import add_engine_flags, engine_config
from engine.config import parse_bytes
from engine.tuning import batch_cap
from loadgen.datasets import parse_range
from planner.calibrate import calibrate, default_fit_path
from planner.memory import default_contexts, device_dtypes, plan_memory
from planner.predict import SLO, advise, attainment, capacity, parse_slo, simulate, summarize
from planner.simulator import SimConfig
from planner.step_model import StepTimeModel
from planner.workload import Workload


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    """pagode serve's engine flags (engine/arg_utils.py), then the workload's and the plan's."""
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as --model: a local path or a hub name ORG/REPO or ORG/REPO:QUANT")
    engine = add_engine_flags(p)
    engine.add_argument("--revision", default=None,
                        help="the hub revision (branch, tag or commit) of a hub model (default: main)")
    w = p.add_argument_group("workload (--seed also seeds the trace)")
    w.add_argument("--input-len", type=parse_range, default=(16, 128), help="prompt tokens MIN:MAX")
    w.add_argument("--output-len", type=parse_range, default=(32, 384), help="output tokens MIN:MAX")
    w.add_argument("--num-prompts", type=int, default=200, help="requests in the simulated trace")
    w.add_argument("--rate", type=float, default=1.0, help="offered Poisson rate, requests/s")
    w.add_argument("--burstiness", type=float, default=1.0)
    g = p.add_argument_group("plan")
    g.add_argument("--slo", type=parse_slo, default=None, help="ttft=MS,itl=MS,e2e=S (itl: per-request TPOT)")
    g.add_argument("--slo-attainment", type=float, default=0.99,
                   help="fraction of requests that must meet the SLO")
    g.add_argument("--fit", type=Path, default=None,
                   help="step-time fit file (default: ~/.cache/pagode/plan/MODEL-DEVICE-WEIGHTS-KV.json)")
    g.add_argument("--serving-overhead", type=parse_overhead, default=(0.0, 0.0), metavar="MS,MS_PER_SEQ",
                   help="serving cost added to each engine step: MS plus MS_PER_SEQ per sequence "
                        "(SSE writes and clients on the same cores; default 0,0: the engine alone)")
    g.add_argument("--calibrate", action="store_true",
                   help="time the real engine over a grid (a minute or two) and save the fit")
    g.add_argument("--json", action="store_true", help="print the plan as JSON")


def parse_overhead(text: str) -> tuple[float, float]:
    """'3,1.1' -> (0.003, 0.0011) seconds: per step and per sequence."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"--serving-overhead wants MS,MS_PER_SEQ, not {text!r}")
    try:
        per_step, per_seq = (float(x) / 1e3 for x in parts)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--serving-overhead wants two numbers, not {text!r}") from err
    if per_step < 0 or per_seq < 0 or not math.isfinite(per_step + per_seq):
        raise argparse.ArgumentTypeError("--serving-overhead wants finite values >= 0")
    return per_step, per_seq


def local_model(args: argparse.Namespace) -> argparse.Namespace:
    """The flags with `model` a local path: a hub name fetched as `pagode serve` fetches it (or
    found in the hub cache when the hub cannot be reached); HubError says why it cannot be."""
    from engine.model.hub import fetch, is_hub_name

    model = args.model_tag or args.model
    path = str(fetch(model, args.revision)) if is_hub_name(model) else model
    return argparse.Namespace(**{**vars(args), "model": path, "model_name": model})


def build_plan(args: argparse.Namespace) -> dict[str, Any]:
    from engine.model.loader import read_config, resolve_model

    config = engine_config(args)
    source = resolve_model(args.model)
    cfg = read_config(source)
    device = config.torch_device.type
    kv_dtype, w_dtype = device_dtypes(config)
    mem = plan_memory(cfg, parse_bytes(args.kv_cache_memory), kv_dtype, w_dtype, args.block_size)
    max_len = args.max_model_len or min(cfg.max_position_embeddings, 2048, mem.kv_tokens)
    from engine import native

    cpu = native.cpu_target().describe() if device == "cpu" else None
    plan: dict[str, Any] = {
        "model": args.model_name or source.name, "device": device, "cpu": cpu, "kv_cache_dtype": kv_dtype,
        "weights_dtype": w_dtype,
        "memory": {"kv_bytes_per_token": mem.kv_bytes_per_token, "kv_cache_bytes": parse_bytes(args.kv_cache_memory),
                   "num_blocks": mem.num_blocks, "kv_tokens": mem.kv_tokens, "parameters": mem.parameters,
                   "weights_bytes": mem.weights_bytes,
                   "max_sequences_by_context": mem.table(default_contexts(cfg.max_position_embeddings))},
    }
    fit_path = args.fit or default_fit_path(source.name, device, w_dtype, kv_dtype)
    if not fit_path.exists():
        plan["prediction"] = None
        plan["note"] = f"no step-time fit at {fit_path}: run `pagode plan --calibrate` first"
        return plan
    model = dataclasses.replace(StepTimeModel.load(fit_path), overhead_s=args.serving_overhead[0],
                                overhead_per_seq_s=args.serving_overhead[1])
    # the batch cap that `pagode serve` would pick from the same calibration
    max_seqs = (args.max_num_seqs if args.max_num_seqs is not None
                else batch_cap.from_decode_rates(model.meta.get("decode_tok_s") or {}, str(fit_path),
                                                 config.max_num_seqs).max_num_seqs)
    sim = SimConfig(num_blocks=mem.num_blocks, block_size=args.block_size, max_model_len=max_len,
                    max_num_seqs=max_seqs, max_num_batched_tokens=config.token_budget,
                    watermark=args.watermark, batching=config.batching,
                    enable_prefix_caching=config.enable_prefix_caching, kv_window=cfg.kv_window)
    workload = Workload(args.input_len, args.output_len, args.num_prompts, args.burstiness, args.seed)
    plan["step_model"] = {**model.to_json(), "path": str(fit_path)}
    plan["prediction"] = predict_at(sim, model, workload, args.rate, args.slo, args.slo_attainment)
    return plan


def predict_at(sim: SimConfig, model: StepTimeModel, workload: Workload, rate: float,
               slo: SLO | None, target: float) -> dict[str, Any]:
    result = simulate(sim, model, workload, rate)
    summary = summarize(result)
    out: dict[str, Any] = {"rate": rate, "num_prompts": workload.num_requests,
                           "input_len": list(workload.input_len), "output_len": list(workload.output_len),
                           **summary}
    if slo is not None:
        share = attainment(result, slo)
        out["slo"] = {**slo.to_json(), "attainment": share, "target": target, "holds": share >= target,
                      "capacity_rate": capacity(sim, model, workload, slo, target, start=rate)}
    out["advice"] = advise(result, summary, sim, slo)
    return out


def ms(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1e3:,.0f}"


def print_plan(plan: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    m = plan["memory"]
    if plan.get("cpu"):
        console.print(f"CPU: {plan['cpu']}")
    console.print(f"[bold]{plan['model']}[/] on {plan['device']}: weights {m['parameters'] / 1e6:.0f} M "
                  f"params = {m['weights_bytes'] / 2**20:,.0f} MiB ({plan['weights_dtype']}); KV "
                  f"{m['kv_bytes_per_token']:,} B/token ({plan['kv_cache_dtype']}) -> {m['num_blocks']:,} "
                  f"blocks = {m['kv_tokens']:,} tokens in {m['kv_cache_bytes'] / 2**30:.2f} GiB")
    t = Table(title="Most sequences at once")
    t.add_column("context tokens", justify="right")
    t.add_column("sequences", justify="right")
    for row in m["max_sequences_by_context"]:
        t.add_row(f"{row['context_len']:,}", f"{row['max_sequences']:,}")
    console.print(t)
    p = plan.get("prediction")
    if p is None:
        console.print(f"[yellow]{plan['note']}[/]")
        return
    model = plan["step_model"]
    terms = zip(model["coefficients"], model["features"], strict=True)
    console.print(f"step time (s) = {' + '.join(f'{c:.3g}*{f}' for c, f in terms)}")
    console.print(f"at {p['rate']:g} req/s ({p['num_prompts']} requests, prompts {p['input_len']}, outputs "
                  f"{p['output_len']}): {p['output_throughput']:.1f} output tok/s, "
                  f"{p['request_throughput']:.2f} req/s, batch up to {p['max_running']}, "
                  f"KV usage up to {p['max_kv_usage']:.0%}, {p['preemptions']} preemptions; "
                  f"the whole trace takes {p['duration_s'] / 60:.1f} min")
    t = Table(title="Predicted latencies (ms)")
    for col in ("metric", "mean", "p50", "p99"):
        t.add_column(col, justify="right")
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s")):
        t.add_row(name, ms(p[key]["mean"]), ms(p[key]["p50"]), ms(p[key]["p99"]))
    console.print(t)
    if "slo" in p:
        s = p["slo"]
        verdict = "[green]holds[/]" if s["holds"] else "[red]fails[/]"
        cap = s["capacity_rate"]
        console.print(f"SLO {verdict}: {s['attainment']:.1%} of requests meet it (target {s['target']:.0%}); "
                      f"highest rate meeting it: {'none' if cap is None else f'{cap:.2f} req/s'}")
    console.print(f"next step: [bold]{p['advice']['next_step']}[/] ({p['advice']['why']})")


def run_plan(args: argparse.Namespace) -> int:
    from engine.model.hub import HubError

    try:
        args = local_model(args)
    except HubError as exc:
        print(f"pagode plan: {exc}", file=sys.stderr)
        return 1
    if args.calibrate:
        config = engine_config(args)
        model = calibrate(config)
        kv_dtype, w_dtype = device_dtypes(config)
        path = args.fit or default_fit_path(model.meta.get("model", "model"), model.device, w_dtype, kv_dtype)
        model.save(path)
        print(f"fit saved to {path}: median step error {model.meta['median_rel_error']:.0%} over "
              f"{model.meta['steps']} steps")
        if not args.json:
            return 0
    plan = build_plan(args)
    if args.json:
        print(json.dumps(plan, indent=1))
    else:
        print_plan(plan)
    return 0
