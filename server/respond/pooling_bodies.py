"""Pooling results -> response bodies: OpenAI's embeddings list (floats, or base64 of
little-endian float32 as the openai SDK decodes it), the rerank results sorted by relevance,
and vLLM's score list."""

from __future__ import annotations

import base64
import time
from typing import Any

import msgspec
import torch

from engine.pooling.pooler import normalize, shorten


def usage(num_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def encode_vector(vector: torch.Tensor, encoding_format: str) -> list[float] | str:
    values = vector.float().numpy()
    if encoding_format == "base64":
        return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")
    return values.tolist()  # type: ignore[no-any-return]


def embeddings_body(vectors: list[torch.Tensor], dimensions: int | None, encoding_format: str,
                    model: str, num_tokens: int) -> dict[str, Any]:
    data = [{"object": "embedding", "index": index, "embedding": encode_vector(shorten(v, dimensions), encoding_format)}
            for index, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": model, "usage": usage(num_tokens)}


def embeddings_json(vectors: list[torch.Tensor], dimensions: int | None, encoding_format: str,
                    model: str, num_tokens: int) -> bytes:
    """embeddings_body as JSON bytes, encoded by msgspec: a float list of hundreds of values
    per input is what FastAPI's own encoder walks slowest, value by value."""
    return msgspec.json.encode(embeddings_body(vectors, dimensions, encoding_format, model, num_tokens))


def rerank_body(request_id: str, model: str, documents: list[str], scores: list[float], top_n: int | None,
                return_documents: bool, num_tokens: int) -> dict[str, Any]:
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    if top_n:
        order = order[:top_n]
    results = []
    for index in order:
        result: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
        if return_documents:
            result["document"] = {"text": documents[index]}
        results.append(result)
    return {"id": request_id, "object": "list", "model": model, "usage": usage(num_tokens), "results": results}


def score_body(request_id: str, model: str, scores: list[float], num_tokens: int) -> dict[str, Any]:
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    return {"id": request_id, "object": "list", "created": int(time.time()), "model": model, "data": data,
            "usage": usage(num_tokens)}


def ollama_embed_body(vectors: list[torch.Tensor], dimensions: int | None, model: str, num_tokens: int,
                      elapsed_ns: int) -> dict[str, Any]:
    """Ollama's answer: unit vectors whatever the model's own normalization, and its timings
    in nanoseconds (nothing is loaded per request: load_duration is 0)."""
    unit = [normalize(v) if dimensions is None else shorten(v, dimensions) for v in vectors]
    return {"model": model, "embeddings": [encode_vector(v, "float") for v in unit],
            "total_duration": elapsed_ns, "load_duration": 0, "prompt_eval_count": num_tokens}
