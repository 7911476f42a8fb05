"""`make bench-lora`: what serving LoRA adapters costs, on pagode and on vLLM's CPU build.

    python -m benchmarks.bench_lora [--servers pagode,vllm] [--mixes 0,1,4] [--rate 16]
                                    [--num-prompts 160] [--output-len 32,384] [--out docs/results/lora] [--quick]

The weights: the default model (SmolLM2-135M) as a Hugging Face folder (bf16 safetensors,
made once from its GGUF by benchmarks/bench_vs_peers.py's `hf_folder`), served by both
servers from that same folder, each with its own defaults for it (vLLM: `--dtype bfloat16`).
The adapters: four random PEFT LoRA adapters written by `peft` on that folder's model,
ranks 8, 16, 8, 16, on q/k/v/o and gate/up/down, with non-zero B (PEFT starts B at zero, an
adapter that would change nothing and might be skipped).

Each server runs twice, one after the other:

- **base**: started without any LoRA flag; the whole trace on the base model;
- **lora**: started with the four adapters (`--lora-modules`, `--max-loras 4`,
  `--max-lora-rank 16`); the same trace once per mix: with 0 adapters (every request on the
  base, LoRA enabled but unused), 1 adapter (every request on it) and 4 adapters (request i
  on adapter i mod 4, so every batch mixes them).

The trace is pagode-loadgen's (public HTTP only: the prompts counted by the server's
/tokenize, Poisson arrivals at --rate, streamed /v1/completions with `ignore_eos`, greedy);
only the `model` of each request differs between mixes. Each mix starts after one untimed
request on each of its models. The figure is output tokens per
second, and each mix's ratio to the base run of the same server (the target: 4 adapters at
0.8x base or more). A server that cannot start, or refuses the LoRA flags, is recorded with
its error and the log's last lines, and the rest still runs.

It writes results.json, table.md and lora.png into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.bench_vs_peers import SERVED_NAME, cpu_line, hf_folder
from benchmarks.pagode_server import REPO_ROOT, serve_command
from loadgen.arrivals import arrival_times
from loadgen.bench import Settings, make_http_client, prepare_prompts
from loadgen.cli import make_console
from loadgen.client import Target, build_payload, send_request
from loadgen.metrics import summarize
from loadgen.records import RequestRecord
from loadgen.server_process import running_command

SEED = 0
RANKS = (8, 16, 8, 16)  # one per adapter: both ranks the issue names, in every mix of two or more
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TARGET_RATIO = 0.8  # 4 adapters' out tok/s over the base's


def adapter_names() -> list[str]:
    return [f"lora-{i}" for i in range(len(RANKS))]


def write_adapters(base: Path, out: Path) -> list[Path]:
    """The four random PEFT adapters over `base`, written once (peft's own save_pretrained)."""
    paths = [out / name for name in adapter_names()]
    if all((p / "adapter_config.json").exists() for p in paths):
        return paths
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    for seed, (rank, path) in enumerate(zip(RANKS, paths, strict=True)):
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, lora_dropout=0.0,
                            init_lora_weights=False)
        peft_model = get_peft_model(model, config)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:  # small enough that the outputs stay text, large enough to change them
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.3 / param.shape[-1] ** 0.5)
        peft_model.save_pretrained(str(path))
        print(f"wrote a rank-{rank} adapter to {path}", flush=True)
    return paths


def lora_flags(server: str, adapters: Sequence[Path]) -> list[str]:
    modules = [f"{name}={path}" for name, path in zip(adapter_names(), adapters, strict=True)]
    flags = ["--lora-modules", *modules] if server == "vllm" else [
        arg for module in modules for arg in ("--lora-modules", module)]
    extra = ["--enable-lora"] if server == "vllm" else []
    return [*extra, *flags, "--max-loras", str(len(adapters)), "--max-lora-rank", str(max(RANKS))]


def server_command(server: str, port: int, folder: Path, lora: list[str], args: argparse.Namespace) -> list[str]:
    if server == "pagode":
        return serve_command(port, ["--model", str(folder), "--served-model-name", SERVED_NAME,
                                    "--disable-access-log", *lora])
    # The OpenAI server's module, as bench_vs_peers starts it (the CPU build's script asks for
    # the version of a distribution named vllm, which it is not).
    python = str(Path(args.vllm_bin).with_name("python"))
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
            "--served-model-name", SERVED_NAME, "--max-model-len", "2048", "--no-enable-log-requests", *lora]


def mix_models(adapters_in_mix: int, n: int) -> list[str]:
    """The `model` of each request: the base, or adapter i mod k."""
    if adapters_in_mix == 0:
        return [SERVED_NAME] * n
    names = adapter_names()[:adapters_in_mix]
    return [names[i % adapters_in_mix] for i in range(n)]


async def replay(url: str, models: list[str], settings: Settings, rate: float) -> dict[str, Any]:
    """loadgen's seeded trace at `rate`, request i naming models[i]; its summary."""
    async with make_http_client(settings.timeout) as http:
        prompts = (await prepare_prompts(http, Target(url, model=SERVED_NAME), settings)).prompts
        await warm_up(http, url, sorted(set(models)))
        arrivals = arrival_times(len(prompts), rate, settings.burstiness, settings.seed)
        records = [RequestRecord(index=i, prompt_len=p.prompt_len, max_tokens=p.output_len, arrival=float(a))
                   for i, (p, a) in enumerate(zip(prompts, arrivals, strict=True))]
        start = time.perf_counter()

        async def one(record: RequestRecord, prompt: Any, model: str) -> None:
            await asyncio.sleep(max(0.0, record.arrival - (time.perf_counter() - start)))
            target = Target(url, model=model)
            await send_request(http, target, build_payload(target, prompt.prompt, prompt.output_len, True),
                               record, start)

        await asyncio.gather(*(one(r, p, m) for r, p, m in zip(records, prompts, models, strict=True)))
        summary = summarize(records, time.perf_counter() - start)
    errors = sorted({r.error for r in records if not r.success and r.error})
    summary["errors"] = errors[:5]
    return summary


async def warm_up(http: httpx.AsyncClient, url: str, models: list[str]) -> None:
    """One short request on each model of the mix, untimed: an adapter's first use (vLLM moves
    it into its slots; pagode builds its row layout) is not what the trace measures."""
    for model in models:
        response = await http.post(f"{url}/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 4,
                                                                  "temperature": 0})
        response.raise_for_status()


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    return {"completed": summary["completed"], "failed": summary["failed"], "errors": summary["errors"],
            "out_tok_s": summary["output_throughput"],
            **{f"{m}_{q}_s": summary[f"{m}_s"][q] for m in ("ttft", "itl") for q in ("p50", "p99")}}


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def measure(server: str, with_lora: bool, mixes: Sequence[int], folder: Path, adapters: list[Path],
            args: argparse.Namespace, console: Any) -> dict[str, Any]:
    """One server start: the base run, or each mix on the LoRA-enabled server."""
    runs = mixes if with_lora else [0]
    flags = lora_flags(server, adapters) if with_lora else []
    label = f"{server}-{'lora' if with_lora else 'base'}"
    log = args.out / f"{label}.server.log"
    low, high = (int(n) for n in args.output_len.split(","))
    settings = Settings(num_prompts=args.num_prompts, input_len=(16, 128), output_len=(low, high), seed=SEED,
                        ignore_eos=True, show_progress=False)
    results: dict[str, Any] = {"command": server_command(server, 0, folder, flags, args)}
    try:
        with running_command(lambda port: server_command(server, port, folder, flags, args), log,
                             args.startup_timeout, {"VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_gib)},
                             cwd=REPO_ROOT) as url:
            for k in runs:
                console.print(f"[bold]{label}[/]: {k} adapter(s) in the mix at {args.rate:g} req/s")
                summary = asyncio.run(replay(url, mix_models(k, args.num_prompts), settings, args.rate))
                results[str(k)] = {"headline": headline(summary), "summary": summary}
                console.print(f"  out tok/s {summary['output_throughput']:.1f}, failed {summary['failed']}")
    except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError, httpx.HTTPError) as exc:
        results["error"] = f"{type(exc).__name__}: {exc}"
        results["log_tail"] = log_tail(log)
        console.print(f"[red]{label} did not run: {results['error']}[/]")
    return results


def ratios(server: dict[str, Any], mixes: Sequence[int]) -> dict[str, float | None]:
    """Each mix's out tok/s over the base run's, of one server."""
    base = server.get("base", {}).get("0", {}).get("headline", {}).get("out_tok_s")
    lora = server.get("lora", {})
    return {str(k): (lora[str(k)]["headline"]["out_tok_s"] / base if base and str(k) in lora else None)
            for k in mixes}


def table(results: dict[str, Any], mixes: Sequence[int], rate: float) -> str:
    head = " | ".join(f"{k} adapter(s): out tok/s · × base · ITL p50" for k in mixes)
    lines = [f"| server (Poisson {rate:g} req/s) | base alone: out tok/s · ITL p50 | {head} |",
             "|---|---:|" + "---:|" * len(mixes)]
    for name, server in results.items():
        problems = [f"{part}: {server[part]['error']}" for part in ("base", "lora") if "error" in server.get(part, {})]
        base = server.get("base", {}).get("0", {}).get("headline")
        cells = [f"{base['out_tok_s']:.1f} · {base['itl_p50_s'] * 1e3:.0f} ms" if base else "n/a"]
        for k in mixes:
            row = server.get("lora", {}).get(str(k), {}).get("headline")
            ratio = server["ratios"].get(str(k))
            cells.append(f"{row['out_tok_s']:.1f} · {ratio:.2f}× · {row['itl_p50_s'] * 1e3:.0f} ms"
                         if row and ratio is not None else (f"{row['out_tok_s']:.1f}" if row else "n/a"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += [f"| {name}: {p.splitlines()[0].replace('|', '/')} |" + " |" * len(cells) for p in problems]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], mixes: Sequence[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(results), 1)
    labels = ["base alone", *(f"{k} adapter(s)" for k in mixes)]
    for i, (name, server) in enumerate(results.items()):
        base = server.get("base", {}).get("0", {}).get("headline", {}).get("out_tok_s")
        lora = server.get("lora", {})
        values = [base, *(lora.get(str(k), {}).get("headline", {}).get("out_tok_s") for k in mixes)]
        xs = [j + i * width for j in range(len(labels))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=name, color=f"C{i}")
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(labels))], labels)
    ax.set(ylabel="output tok/s", title="LoRA adapters in the mix: output throughput")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="pagode,vllm", help="comma-separated: pagode, vllm")
    ap.add_argument("--mixes", default="0,1,4", help="adapters in the mix, each run on the LoRA-enabled server")
    ap.add_argument("--rate", type=float, default=16.0, help="Poisson arrivals per second")
    ap.add_argument("--num-prompts", type=int, default=160)
    ap.add_argument("--output-len", default="32,384", help="LO,HI output tokens per request (as bench-vs-peers)")
    ap.add_argument("--quick", action="store_true", help="a quarter of the requests (a smoke run)")
    ap.add_argument("--vllm-bin", default=str(REPO_ROOT / ".venv-vllm" / "bin" / "vllm"))
    ap.add_argument("--vllm-kv-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "pagode",
                    help="where the HF folder and the adapters are written once")
    ap.add_argument("--out", type=Path, default=Path("docs/results/lora"))
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.quick:
        args.num_prompts = max(args.num_prompts // 4, 8)
    mixes = [int(k) for k in args.mixes.split(",")]
    if any(not 0 <= k <= len(RANKS) for k in mixes):
        ap.error(f"each mix is 0 to {len(RANKS)} adapters")
    console = make_console()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = hf_folder(args.cache)
    adapters = write_adapters(folder, args.cache / "lora-bench")
    results: dict[str, Any] = {}
    for server in args.servers.split(","):
        runs = {"base": measure(server, False, mixes, folder, adapters, args, console),
                "lora": measure(server, True, mixes, folder, adapters, args, console)}
        runs["ratios"] = ratios(runs, mixes)
        results[server] = runs
    report = {"cpu": cpu_line(), "python": sys.version.split()[0], "model": SERVED_NAME, "rate": args.rate,
              "num_prompts": args.num_prompts, "output_len": args.output_len, "quick": args.quick,
              "ranks": list(RANKS), "targets": TARGETS,
              "target_ratio": TARGET_RATIO, "results": results}
    (args.out / "results.json").write_text(json.dumps(report, indent=2))
    text = f"CPU: {report['cpu']}\nModel: {SERVED_NAME} (bf16 HF folder), {args.num_prompts} requests\n\n"
    text += table(results, mixes, args.rate)
    (args.out / "table.md").write_text(text)
    plot(results, mixes, args.out / "lora.png")
    print(text)
    return 0 if all("error" not in r.get(part, {}) for r in results.values() for part in ("base", "lora")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
