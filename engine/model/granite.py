"""Granite: Llama layers with four scalars: embeddings x embedding_multiplier, the softmax
scale attention_multiplier, residual + out x residual_multiplier, logits / logits_scaling.

llama.cpp's converter writes them as {arch}.embedding_scale, .attention.scale,
.residual_scale and .logit_scale."""

from __future__ import annotations

from typing import Any

from engine.model.family import Family, GGUFMetadata, Support
from engine.model.registry import register


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "embedding_multiplier": float(cfg.get("embedding_multiplier", 1.0)),
        "residual_multiplier": float(cfg.get("residual_multiplier", 1.0)),
        "attention_multiplier": float(cfg.get("attention_multiplier", 1.0)),
        "logits_scaling": float(cfg.get("logits_scaling", 1.0)),
        "attention_bias": cfg.get("attention_bias", False),
    }


def gguf_fields(gguf: GGUFMetadata) -> dict[str, Any]:
    return {
        "embedding_multiplier": float(gguf.arch_field("embedding_scale", 1.0)),
        "residual_multiplier": float(gguf.arch_field("residual_scale", 1.0)),
        "attention_multiplier": float(gguf.arch_field("attention.scale", 1.0)),
        "logits_scaling": float(gguf.arch_field("logit_scale", 1.0)),
    }


FAMILY = register(Family(
    model_type="granite", gguf_arch="granite", hf_fields=hf_fields, gguf_fields=gguf_fields,
    permute_qk=True, support=Support(proved=("folder", "converter Q8_0", "GGUF Q8_0", "int8/int4 gate")),
    notes="embedding, residual, attention and logits multipliers",
))
