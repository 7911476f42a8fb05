"""Qwen3 (dense): RMSNorm(head_dim) on each query and key head before RoPE, no QKV bias,
and a head_dim of its own (not hidden / heads)."""

from __future__ import annotations

from typing import Any

from engine.model.family import Family, Support
from engine.model.qwen_window import window_fields
from engine.model.registry import register


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qk_norm": "head", "attention_bias": cfg.get("attention_bias", False), **window_fields(cfg)}


def gguf_fields(_: Any) -> dict[str, Any]:
    return {"qk_norm": "head"}


FAMILY = register(Family(
    model_type="qwen3", gguf_arch="qwen3", hf_fields=hf_fields, gguf_fields=gguf_fields,
    gguf_tensors={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    support=Support(proved=("folder", "GGUF Q8_0", "converter Q8_0, Q4_K_M", "int8/int4 gate",
                                                  "sliding window layers: folder")),
    notes="per-head q/k RMSNorm before RoPE; use_sliding_window as qwen2",
))
