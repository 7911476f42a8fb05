"""Embeddings per second: pagode's /v1/embeddings over HTTP against sentence-transformers'
`encode` in this process, on the same folder, the same inputs and the same CPU, one after the
other.

    python -m benchmarks.bench_embed [--model FOLDER] [--inputs 1000] [--min-tokens 16] [--max-tokens 256]
    make bench-embed ARGS="--inputs 64"      # a smoke run

Without --model it builds a random BERT at all-MiniLM-L6-v2's shape (benchmarks/embed_model.py).
pagode gets the inputs as `--batch` inputs a request, `--concurrency` requests in flight, so its
engine packs them across requests; sentence-transformers encodes with the same batch size.
llama.cpp's `llama-server --embedding` is not measured: it needs a GGUF of the same model, and
pagode reads GGUF decoder embedders only, not the BERT this benchmark serves by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from benchmarks.embed_model import build_minilm, texts
from benchmarks.pagode_server import running_server


async def pagode_rate(url: str, inputs: list[str], batch: int, concurrency: int) -> tuple[float, list[Any]]:
    """(inputs per second, the vectors in order) over HTTP."""
    chunks = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    vectors: list[Any] = [None] * len(chunks)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        async def send(index: int) -> None:
            async with gate:
                reply = await http.post("/v1/embeddings", json={"input": chunks[index]})
                reply.raise_for_status()
                vectors[index] = [d["embedding"] for d in reply.json()["data"]]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="a sentence-transformers folder")
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="inputs per request and per encode batch")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="a bar chart of embeddings/s, as PNG")
    args = parser.parse_args()
    folder = args.model or build_minilm(Path(tempfile.gettempdir()) / "pagode-bench-minilm")
    inputs = texts(args.inputs, args.min_tokens, args.max_tokens)
    with running_server(["--model", str(folder), "--max-num-batched-tokens", "8192"],
                        Path(tempfile.gettempdir()) / "pagode-bench-embed.log") as url:
        pagode, pagode_vectors = asyncio.run(pagode_rate(url, inputs, args.batch, args.concurrency))
    reference, reference_vectors = sentence_transformers_rate(folder, inputs, args.batch)
    cosine = torch.nn.functional.cosine_similarity(torch.tensor(pagode_vectors), torch.tensor(reference_vectors))
    result = {"model": str(folder), "inputs": args.inputs, "tokens": [args.min_tokens, args.max_tokens],
              "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "pagode_per_s": round(pagode, 1), "sentence_transformers_per_s": round(reference, 1),
              "ratio": round(pagode / reference, 2), "min_cosine": round(cosine.min().item(), 6)}
    print("| server | embeddings/s |\n|---|---:|")
    print(f"| pagode /v1/embeddings | {result['pagode_per_s']} |")
    print(f"| sentence-transformers encode | {result['sentence_transformers_per_s']} |")
    print(f"pagode / sentence-transformers: {result['ratio']}x; min cosine between them {result['min_cosine']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["pagode\n/v1/embeddings", "sentence-transformers\nencode"]
    rates = [result["pagode_per_s"], result["sentence_transformers_per_s"]]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(names, rates, color=["#2a6f97", "#999999"])
    ax.set_ylabel("embeddings / s")
    ax.set_title(f"{result['inputs']} inputs of {result['tokens'][0]}-{result['tokens'][1]} tokens")
    for x, rate in enumerate(rates):
        ax.text(x, rate, f"{rate:.0f}", ha="center", va="bottom")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
