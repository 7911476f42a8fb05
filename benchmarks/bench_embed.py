"""Embeddings per second: pagode's /v1/embeddings over HTTP against sentence-transformers'
`encode` in this process and llama.cpp's `llama-server --embedding`, on the same model, the
same inputs and the same CPU, one after the other.

    python -m benchmarks.bench_embed [--models minilm,qwen3] [--inputs 1000] [--min-tokens 16] [--max-tokens 256]
    make bench-embed ARGS="--inputs 64"      # a smoke run

Two models, both random weights built here (no hub is reachable), each at a CPU embedder's size:
- `minilm`: a BERT at all-MiniLM-L6-v2's shape (benchmarks/embed_model.py); pagode serves its
  folder, sentence-transformers encodes the folder. llama-server is not run on it: no BERT GGUF
  can be written here (docs/embeddings.md, "Not done yet").
- `qwen3`: a Qwen3-Embedding-style decoder (last token, normalized) with SmolLM2's real
  tokenizer, written as GGUF by llama.cpp's own converter; pagode and llama-server serve that
  file, sentence-transformers encodes the folder it was written from.
`--model FOLDER` replaces minilm's folder with a sentence-transformers folder of your own.

Clients send `--batch` inputs a request, `--concurrency` requests in flight, pagode's answers
as base64 (what the openai SDK asks for by default), llama-server's as floats;
sentence-transformers encodes with the same batch size. Every server's vectors are checked
against sentence-transformers' (min cosine printed).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from benchmarks.embed_model import build_minilm, build_qwen3_embedding, convert_to_gguf, texts
from benchmarks.pagode_server import running_server

SCRATCH = Path(tempfile.gettempdir())
LLAMA_SLOTS = 4  # llama-server's parallel slots: one per request in flight


def decode(item: dict[str, Any]) -> list[float]:
    vector = item["embedding"]
    if isinstance(vector, str):
        return np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()  # type: ignore[no-any-return]
    return vector  # type: ignore[no-any-return]


async def server_rate(url: str, inputs: list[str], batch: int, concurrency: int,
                      encoding_format: str) -> tuple[float, list[Any]]:
    """(inputs per second, the vectors in order) over HTTP."""
    chunks = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    vectors: list[Any] = [None] * len(chunks)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        async def send(index: int) -> None:
            async with gate:
                reply = await http.post("/v1/embeddings", json={"input": chunks[index], "model": "embedder",
                                                                "encoding_format": encoding_format})
                reply.raise_for_status()
                data = sorted(reply.json()["data"], key=lambda d: d["index"])
                vectors[index] = [decode(d) for d in data]

        await send(0)  # warm: the first forward's allocations are no part of the rate
        start = time.perf_counter()
        await asyncio.gather(*(send(i) for i in range(len(chunks))))
        seconds = time.perf_counter() - start
    return len(inputs) / seconds, [v for chunk in vectors for v in chunk]


def sentence_transformers_rate(folder: Path, inputs: list[str], batch: int) -> tuple[float, Any]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    model.encode(inputs[:batch], batch_size=batch)
    start = time.perf_counter()
    vectors = model.encode(inputs, batch_size=batch)
    return len(inputs) / (time.perf_counter() - start), vectors


@contextmanager
def llama_server(gguf: Path, log: Path) -> Iterator[str]:
    """llama-server --embedding on the file, built for this CPU (benchmarks/llama_server.py);
    its batch holds a whole slot, since an embedding's input must fit one micro-batch."""
    from benchmarks.llama_server import build
    from loadgen.server_process import running_command

    context = 2048
    with running_command(lambda port: [str(build()), "-m", str(gguf), "--embedding", "--host", "127.0.0.1",
                                       "--port", str(port), "-np", str(LLAMA_SLOTS), "-c", str(context * LLAMA_SLOTS),
                                       "-b", str(context), "-ub", str(context), "--alias", "embedder", "--no-webui"],
                         log) as url:
        yield url


def min_cosine(got: list[Any], want: Any) -> float:
    return torch.nn.functional.cosine_similarity(torch.tensor(got), torch.as_tensor(want)).min().item()


def measure(name: str, folder: Path, served: Path, args: argparse.Namespace, inputs: list[str]) -> dict[str, Any]:
    """One model's rates: pagode serving `served` (the folder or its GGUF), sentence-transformers
    on the folder, and llama-server where `served` is a GGUF."""
    rates: dict[str, float] = {}
    cosines: dict[str, float] = {}
    with running_server(["--model", str(served), "--served-model-name", "embedder",
                         "--max-num-batched-tokens", str(args.token_budget)],
                        SCRATCH / f"pagode-bench-embed-{name}.log") as url:
        rates["pagode"], pagode_vectors = asyncio.run(server_rate(url, inputs, args.batch, args.concurrency, "base64"))
    vectors = {"pagode": pagode_vectors}
    if served.suffix == ".gguf" and not args.no_llama_server:
        with llama_server(served, SCRATCH / f"llama-server-bench-embed-{name}.log") as url:
            rates["llama-server"], vectors["llama-server"] = asyncio.run(
                server_rate(url, inputs, args.batch, args.concurrency, "float"))
    rates["sentence-transformers"], reference = sentence_transformers_rate(folder, inputs, args.batch)
    for server, got in vectors.items():
        cosines[server] = round(min_cosine(got, reference), 6)
    peers = [rate for server, rate in rates.items() if server != "pagode"]
    return {"model": name, "folder": str(folder), "served": str(served),
            "per_s": {k: round(v, 1) for k, v in rates.items()}, "min_cosine_to_sentence_transformers": cosines,
            "ratio_to_fastest_peer": round(rates["pagode"] / max(peers), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm,qwen3", help="comma-separated: minilm, qwen3")
    parser.add_argument("--model", type=Path, default=None, help="a sentence-transformers folder instead of minilm's")
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="inputs per request and per encode batch")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--token-budget", type=int, default=8192, help="pagode's --max-num-batched-tokens")
    parser.add_argument("--outtype", default="f32", help="the converter's --outtype for qwen3's GGUF")
    parser.add_argument("--no-llama-server", action="store_true", help="skip llama-server (it is built on first use)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="a bar chart of embeddings/s, as PNG")
    args = parser.parse_args()
    inputs = texts(args.inputs, args.min_tokens, args.max_tokens)
    results = []
    for name in args.models.split(","):
        if name == "minilm":
            folder = args.model or build_minilm(SCRATCH / "pagode-bench-minilm")
            results.append(measure(name, folder, folder, args, inputs))
        elif name == "qwen3":
            folder = build_qwen3_embedding(SCRATCH / "pagode-bench-qwen3-embedding")
            results.append(measure(name, folder, convert_to_gguf(folder, args.outtype), args, inputs))
        else:
            raise SystemExit(f"unknown model {name!r}; expected minilm or qwen3")
    print_table(results, args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"inputs": args.inputs, "tokens": [args.min_tokens, args.max_tokens],
                                         "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                                         "results": results}, indent=2) + "\n")
    if args.plot:
        plot(results, args, args.plot)


def print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"{args.inputs} inputs of {args.min_tokens}-{args.max_tokens} words, {args.batch} a request, "
          f"{args.concurrency} in flight")
    print("| model | server | embeddings/s | min cosine to sentence-transformers |\n|---|---|---:|---:|")
    for result in results:
        for server, rate in result["per_s"].items():
            cosine = result["min_cosine_to_sentence_transformers"].get(server, "")
            print(f"| {result['model']} | {server} | {rate} | {cosine} |")
        print(f"| {result['model']} | pagode / fastest peer | {result['ratio_to_fastest_peer']}x | |")


def plot(results: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"pagode": "#2a6f97", "sentence-transformers": "#999999", "llama-server": "#c07a2c"}
    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.2), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        names, rates = list(result["per_s"]), list(result["per_s"].values())
        ax.bar(names, rates, color=[colors.get(n, "#555555") for n in names])
        ax.set_ylabel("embeddings / s")
        ax.set_title(f"{result['model']}: {args.inputs} inputs of {args.min_tokens}-{args.max_tokens} words")
        for x, rate in enumerate(rates):
            ax.text(x, rate, f"{rate:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
