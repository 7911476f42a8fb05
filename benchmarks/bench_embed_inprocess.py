"""pagode's pooling engine against sentence-transformers' `encode` in one process, on one
thread, timed by `time.thread_time()`: a ratio that holds on a busy machine, where the
wall-clock rates of `make bench-embed` measure the neighbours as much as the servers.

    python -m benchmarks.bench_embed_inprocess [--models minilm,qwen3] [--inputs 200] [--repeats 3]

pagode's leg is what a /v1/embeddings request costs the server short of HTTP: the texts
tokenized a request (`--batch`) at a time, every input through PoolingModel.embed under the
token budget (as the engine's worker runs it), and each request's answer encoded as base64
JSON. sentence-transformers' leg is `encode(batch_size=--batch)`. The two alternate, and the
median of each is reported, with the smallest cosine between their vectors. The tokenizers
run in the calling thread (TOKENIZERS_PARALLELISM=false), so thread_time sees all of it.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from benchmarks.embed_model import build_minilm, build_qwen3_embedding, texts  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.pooling.inputs import encode_texts  # noqa: E402
from engine.pooling.pooling_model import PoolingModel  # noqa: E402
from server.respond.pooling_bodies import embeddings_json  # noqa: E402

SCRATCH = Path(tempfile.gettempdir())


def pagode_leg(model: PoolingModel, inputs: list[str], batch: int) -> list[torch.Tensor]:
    requests = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    tokenized = [encode_texts(model.tokenizer, r, None) for r in requests]
    vectors = model.embed([item for request in tokenized for item in request])
    for start in range(0, len(vectors), batch):
        embeddings_json(vectors[start:start + batch], None, "base64", "m", 0)
    return vectors


def thread_seconds(work: Any) -> tuple[float, Any]:
    start = time.thread_time()
    result = work()
    return time.thread_time() - start, result


def compare(name: str, folder: Path, args: argparse.Namespace) -> None:
    from sentence_transformers import SentenceTransformer

    inputs = texts(args.inputs, args.min_tokens, args.max_tokens)
    model = PoolingModel(EngineConfig(model=str(folder), quantization=args.quantization,
                                      max_num_batched_tokens=args.token_budget), "embed")
    reference = SentenceTransformer(str(folder), device="cpu")
    pagode_leg(model, inputs[:args.batch], args.batch)  # warm both
    reference.encode(inputs[:args.batch], batch_size=args.batch)
    times: dict[str, list[float]] = {"pagode": [], "sentence-transformers": []}
    for _ in range(args.repeats):
        seconds, got = thread_seconds(lambda: pagode_leg(model, inputs, args.batch))
        times["pagode"].append(seconds)
        seconds, want = thread_seconds(lambda: reference.encode(inputs, batch_size=args.batch, convert_to_tensor=True))
        times["sentence-transformers"].append(seconds)
    cosine = torch.nn.functional.cosine_similarity(torch.stack(got), want).min().item()
    pagode, peer = (statistics.median(times[k]) for k in ("pagode", "sentence-transformers"))
    print(f"| {name} | {model.precision} | {args.inputs / pagode:.1f} | {args.inputs / peer:.1f} | "
          f"{peer / pagode:.2f}x | {cosine:.6f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="minilm,qwen3", help="comma-separated: minilm, qwen3")
    parser.add_argument("--inputs", type=int, default=200)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--token-budget", type=int, default=8192)
    parser.add_argument("--quantization", default="auto", help="pagode's --quantization (none: fp32)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"one thread, {args.inputs} inputs of {args.min_tokens}-{args.max_tokens} words, median of {args.repeats}")
    print("| model | pagode precision | pagode /s of thread time | sentence-transformers /s | ratio | min cosine |")
    print("|---|---|---:|---:|---:|---:|")
    for name in args.models.split(","):
        builders = {"minilm": build_minilm, "qwen3": build_qwen3_embedding}
        compare(name, builders[name](SCRATCH / f"pagode-bench-{'minilm' if name == 'minilm' else 'qwen3-embedding'}"),
                args)


if __name__ == "__main__":
    main()
