"""`make bench-spec`: speculative decoding off and on, in one run, on one machine.

    python -m benchmarks.bench_spec [--num-prompts 24] [--output-len 128] [--rates 2 16]
                                    [--spec-config JSON] [--out-dir docs/results/spec]
                                    [--llama-server]

Two workloads, each greedy over the chat endpoint:
- input-grounded: correct the spelling of a given passage, summarise a given passage,
  reformat a JSON object given in the prompt (what n-gram prompt lookup is for);
- open prose: write about a topic (little to copy: drafts must not cost).
Each runs as one stream (one request at a time), then as Poisson arrivals at each rate,
first against `pagode serve` without speculation, then against one with
--speculative-config; the same prompts, arrival times and output lengths (ignore_eos) both
times, so output tok/s compare like for like. The server's spec-decode counters, read
from /metrics before and after each run, give the acceptance rate and the mean acceptance
length.

With --llama-server, llama.cpp's server (built here for this CPU, benchmarks/llama_server.py)
runs the one-stream loads on the same GGUF, without and with its own n-gram speculation
(`--spec-type ngram-simple --spec-ngram-simple-size-m k`: drafts of the same k tokens), on
the same prompts: the side-by-side of one user waiting alone. Its speculation counters are
not scraped (it exports none in vLLM's names), so its rows have speeds only.

Writes bench_spec.json, bench_spec.md (the table) and bench_spec.png (the speed-up per
workload and load) to --out-dir. Run it on a quiet machine: the figures are the machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.llama_server import build as build_llama_server
from benchmarks.pagode_server import running_server
from engine.model.loader import default_model_path
from loadgen.bench import RateResult, Settings, make_http_client, run_rate
from loadgen.cli import make_console
from loadgen.client import Target
from loadgen.prose import load_words
from loadgen.server_process import running_command
from loadgen.spans import PromptSpec

SPEC_CONFIG = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
WORKLOADS = ("input-grounded", "open prose")
TOPICS = ["the sea", "a fox", "Mars", "bread", "a violin", "winter", "a lighthouse", "tea", "chess",
          "a bridge", "rain", "the moon"]
CHAT = "/v1/chat/completions"
SERVED_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Load:
    name: str
    rate: float  # requests per second; inf with concurrency 1 is one stream
    concurrency: int | None


def loads(rates: list[float]) -> list[Load]:
    return [Load("1 stream", math.inf, 1), *(Load(f"Poisson {r:g} req/s", r, None) for r in rates)]


# ---- prompts -------------------------------------------------------------------------------

def passage(words: list[str], rng: random.Random, length: int) -> str:
    start = rng.randrange(0, len(words) - length)
    return " ".join(words[start:start + length])


def misspell(text: str, rng: random.Random) -> str:
    """Swap two letters in about one word in six: a passage to correct."""
    out = []
    for word in text.split():
        if len(word) > 4 and rng.random() < 1 / 6:
            i = rng.randrange(1, len(word) - 2)
            word = word[:i] + word[i + 1] + word[i] + word[i + 2:]
        out.append(word)
    return " ".join(out)


def json_record(rng: random.Random, words: list[str]) -> str:
    record = {"id": rng.randrange(10_000), "name": rng.choice(words), "tags": rng.sample(words, 3),
              "score": round(rng.random() * 100, 2), "active": rng.random() < 0.5,
              "note": passage(words, rng, 12)}
    return json.dumps(record)


def grounded_prompt(i: int, words: list[str], rng: random.Random, length: int) -> str:
    kind = i % 3
    if kind == 0:
        return ("Correct the spelling mistakes in this passage and return the whole corrected "
                f"passage:\n\n{misspell(passage(words, rng, length), rng)}")
    if kind == 1:
        return f"Summarise this passage, quoting its key sentences:\n\n{passage(words, rng, length)}"
    return ("Reformat this JSON object with one key per line and two-space indentation; "
            f"keep every value:\n\n{json_record(rng, words)}")


def prose_prompt(i: int) -> str:
    return f"Write a few paragraphs about {TOPICS[i % len(TOPICS)]}."


async def count_tokens(http: httpx.AsyncClient, url: str, prompt: str) -> int:
    response = await http.post(url + "/tokenize", json={"messages": [{"role": "user", "content": prompt}]})
    response.raise_for_status()
    return int(response.json()["count"])


async def prompt_specs(http: httpx.AsyncClient, url: str, workload: str, n: int, output_len: int,
                       passage_words: int, seed: int) -> list[PromptSpec]:
    rng = random.Random(seed)
    words = load_words(None)
    texts = [grounded_prompt(i, words, rng, passage_words) if workload == WORKLOADS[0] else prose_prompt(i)
             for i in range(n)]
    return [PromptSpec(t, await count_tokens(http, url, t), output_len, exact=True) for t in texts]


# ---- runs ----------------------------------------------------------------------------------

def row(run: RateResult) -> dict[str, Any]:
    s, srv = run.summary, run.server
    return {
        "completed": s["completed"], "failed": s["failed"], "out_tok_s": s["output_throughput"],
        "ttft_p50_s": s["ttft_s"]["p50"], "itl_p50_s": s["itl_s"]["p50"], "e2e_p50_s": s["e2e_s"]["p50"],
        "spec_drafts": srv.get("spec_drafts"), "spec_draft_tokens": srv.get("spec_draft_tokens"),
        "spec_accepted_tokens": srv.get("spec_accepted_tokens"),
        "acceptance_rate": srv.get("spec_acceptance_rate"),
        "mean_acceptance_length": srv.get("spec_mean_acceptance_length"),
    }


async def specs_for(url: str, args: argparse.Namespace) -> dict[str, list[PromptSpec]]:
    """Each workload's prompts, counted by pagode's /tokenize (the same for every server)."""
    async with make_http_client(60.0) as http:
        return {w: await prompt_specs(http, url, w, args.num_prompts, args.output_len, args.passage_words,
                                      args.seed) for w in WORKLOADS}


async def measure(url: str, specs: dict[str, list[PromptSpec]], run_loads: list[Load],
                  settings: Settings) -> dict[str, dict[str, Any]]:
    """Every workload at every load against one server: {"workload|load": row}."""
    console = make_console()
    out: dict[str, dict[str, Any]] = {}
    async with make_http_client(settings.timeout) as http:
        target = Target(url, CHAT)
        for workload in WORKLOADS:
            for load in run_loads:
                run = await run_rate(http, target, specs[workload], load.rate, settings, console, load.concurrency)
                out[f"{workload}|{load.name}"] = row(run)
    return out


def server_args(args: argparse.Namespace, spec: bool) -> list[str]:
    extra = ["--speculative-config", args.spec_config] if spec else []
    return ["--kv-cache-memory", args.kv_cache_memory, "--disable-access-log", *args.server_arg, *extra]


def llama_server_command(binary: Path, args: argparse.Namespace, spec: bool) -> Callable[[int], list[str]]:
    k = json.loads(args.spec_config).get("num_speculative_tokens", 4)
    extra = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(k)] if spec else []
    return lambda port: [str(binary), "-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
                         "-np", "1", "-c", "4096", "--alias", SERVED_NAME, *extra]


def run_both(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(num_prompts=args.num_prompts, seed=args.seed, ignore_eos=True, show_progress=False)
    results: dict[str, Any] = {"spec_config": json.loads(args.spec_config), "machine": platform.platform(),
                               "num_prompts": args.num_prompts, "output_len": args.output_len, "runs": {}}
    specs: dict[str, list[PromptSpec]] = {}
    for spec in (False, True):
        log = args.out_dir / f"server-{'on' if spec else 'off'}.log"
        with running_server(server_args(args, spec), log, args.startup_timeout) as url:
            specs = specs or asyncio.run(specs_for(url, args))
            results["runs"]["on" if spec else "off"] = asyncio.run(measure(url, specs, loads(args.rates), settings))
    if args.llama_server:
        try:
            results["runs"].update(run_llama_server(args, specs, settings))
        except (RuntimeError, TimeoutError, OSError, subprocess.CalledProcessError) as exc:
            results["llama_server_error"] = f"{type(exc).__name__}: {exc}"  # pagode's rows still count
            print(f"llama-server did not run: {results['llama_server_error']}")
    return results


def run_llama_server(args: argparse.Namespace, specs: dict[str, list[PromptSpec]],
                     settings: Settings) -> dict[str, Any]:
    binary = build_llama_server()
    runs = {}
    for spec in (False, True):
        name = f"llama-server {'on' if spec else 'off'}"
        with running_command(llama_server_command(binary, args, spec), args.out_dir / f"{name}.log",
                             args.startup_timeout) as url:
            runs[name] = asyncio.run(measure(url, specs, loads([]), settings))
    return runs


# ---- report --------------------------------------------------------------------------------

def fmt(value: float | None, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def table_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    off, on = results["runs"]["off"], results["runs"]["on"]
    rows = []
    for key in off:
        workload, load = key.split("|")
        a, b = off[key], on[key]
        speedup = b["out_tok_s"] / a["out_tok_s"] if a["out_tok_s"] else None
        rows.append({"workload": workload, "load": load, "off_tok_s": a["out_tok_s"], "on_tok_s": b["out_tok_s"],
                     "speedup": speedup, "itl_p50_off_s": a["itl_p50_s"], "itl_p50_on_s": b["itl_p50_s"],
                     "acceptance_rate": b["acceptance_rate"], "mean_acceptance_length": b["mean_acceptance_length"]})
    return rows


def peer_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """llama-server's one-stream rows beside pagode's, where the run had them."""
    runs = results["runs"]
    if "llama-server on" not in runs:
        return []
    rows = []
    for key, a in runs["llama-server off"].items():
        workload, load = key.split("|")
        b = runs["llama-server on"][key]
        rows.append({"workload": workload, "load": load, "off_tok_s": a["out_tok_s"], "on_tok_s": b["out_tok_s"],
                     "speedup": b["out_tok_s"] / a["out_tok_s"] if a["out_tok_s"] else None,
                     "pagode_on_tok_s": runs["on"][key]["out_tok_s"]})
    return rows


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Speculative decoding, `{json.dumps(results['spec_config'])}`; {results['num_prompts']} prompts "
             f"per run, {results['output_len']} output tokens each (ignore_eos); {results['machine']}.", "",
             "| workload | load | off out tok/s | on out tok/s | on/off | ITL p50 off ms | ITL p50 on ms "
             "| acceptance rate | mean acceptance length |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table_rows(results):
        lines.append(f"| {r['workload']} | {r['load']} | {fmt(r['off_tok_s'])} | {fmt(r['on_tok_s'])} "
                     f"| {fmt(r['speedup'], 2)} | {fmt(r['itl_p50_off_s'], 1, 1e3)} | {fmt(r['itl_p50_on_s'], 1, 1e3)} "
                     f"| {percent(r['acceptance_rate'])} | {fmt(r['mean_acceptance_length'], 2)} |")
    peers = peer_rows(results)
    if peers:
        lines += ["", "llama.cpp's llama-server on the same GGUF, `--spec-type ngram-simple` for \"on\":", "",
                  "| workload | load | llama-server off tok/s | llama-server on tok/s | on/off | pagode on tok/s "
                  "| pagode on / llama-server on |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in peers:
            ratio = r["pagode_on_tok_s"] / r["on_tok_s"] if r["on_tok_s"] else None
            lines.append(f"| {r['workload']} | {r['load']} | {fmt(r['off_tok_s'])} | {fmt(r['on_tok_s'])} "
                         f"| {fmt(r['speedup'], 2)} | {fmt(r['pagode_on_tok_s'])} | {fmt(ratio, 2)} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table_rows(results)
    load_names = list(dict.fromkeys(r["load"] for r in rows))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(WORKLOADS)
    for w, workload in enumerate(WORKLOADS):
        values = [next((r["speedup"] or 0.0 for r in rows if r["workload"] == workload and r["load"] == name), 0.0)
                  for name in load_names]
        ax.bar([i + w * width for i in range(len(load_names))], values, width, label=workload)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(WORKLOADS) - 1) / 2 for i in range(len(load_names))], load_names)
    ax.set_ylabel("out tok/s, on / off")
    ax.set_title("Speculative decoding (n-gram prompt lookup)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_spec", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=24, help="prompts per run (each load, each workload)")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--passage-words", type=int, default=90, help="words of the passage in grounded prompts")
    ap.add_argument("--rates", type=float, nargs="+", default=[2.0, 16.0], help="Poisson rates, req/s")
    ap.add_argument("--spec-config", default=SPEC_CONFIG)
    ap.add_argument("--kv-cache-memory", default="1GiB")
    ap.add_argument("--server-arg", action="append", default=[], help="extra pagode serve argument")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=Path("docs/results/spec"))
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    ap.add_argument("--llama-server", action="store_true",
                    help="also run llama.cpp's server (built here) for the one-stream loads, off and on")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results = run_both(args)
    (args.out_dir / "bench_spec.json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    (args.out_dir / "bench_spec.md").write_text(text)
    plot(results, args.out_dir / "bench_spec.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
