"""Where an adapter comes from: a PEFT folder, or llama.cpp's GGUF LoRA file (`.gguf`)."""

from __future__ import annotations

from pathlib import Path

from engine.lora.adapter import LoraAdapter, read_peft_adapter
from engine.lora.gguf_adapter import read_gguf_adapter
from engine.model.config import ModelConfig


def read_adapter(name: str, path: str | Path, max_rank: int, cfg: ModelConfig) -> LoraAdapter:
    if Path(path).suffix == ".gguf" and Path(path).is_file():
        return read_gguf_adapter(name, path, max_rank, cfg)
    return read_peft_adapter(name, path, max_rank)
