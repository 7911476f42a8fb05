"""What a GGUF file says about pooling: llama.cpp's converter writes `{arch}.pooling_type`
from sentence-transformers' Pooling module (0 none, 1 mean, 2 cls, 3 last, 4 rank), so a
Qwen3-Embedding file carries its last-token pooling. The file has no Normalize module to
read: it is normalized, as llama-server normalizes embeddings by default."""

from __future__ import annotations

from pathlib import Path

from engine.model.gguf_file import GGUFModel
from engine.pooling.checkpoint import ENCODER_TYPES, PoolingSpec

POOLING_TYPES = {1: "mean", 2: "cls", 3: "last"}
RANK = 4
ENCODER_ARCHS = ("bert", "nomic-bert", "jina-bert-v2", "modern-bert")


def gguf_pooling_type(path: Path) -> int | None:
    value = GGUFModel(path).arch_field("pooling_type")
    return None if value is None else int(value)


def gguf_task(path: Path) -> str:
    kind = gguf_pooling_type(path)
    if kind == RANK:
        return "score"
    return "embed" if kind in POOLING_TYPES else "generate"


def gguf_spec(path: Path, task: str) -> PoolingSpec:
    """The spec of a decoder GGUF read for embeddings; encoders and rank files are refused,
    by name, at load."""
    header = GGUFModel(path)
    if header.arch in ENCODER_ARCHS or header.arch in ENCODER_TYPES:
        raise ValueError(f"{path.name}: GGUF {header.arch} encoders are not supported yet; serve the "
                         "sentence-transformers folder instead")
    if task != "embed":
        raise ValueError(f"{path.name}: pagode scores pairs from Hugging Face folders only; a GGUF "
                         "reranker is not supported yet")
    return PoolingSpec(task="embed", model_type=header.arch, pooling=POOLING_TYPES.get(gguf_pooling_type(path) or 3,
                                                                                        "last"),
                       normalize=True, matryoshka=True)
