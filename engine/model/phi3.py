"""Phi-3 / Phi-3.5 / Phi-4-mini: checkpoints with fused qkv_proj ([q|k|v]) and gate_up_proj
(gate first), LongRoPE with short and long factors, and partial rotary (Phi-4-mini: 0.75).

The fused checkpoint tensors load straight into the model's own fused projections. In a GGUF,
llama.cpp keeps them fused as attn_qkv and ffn_up, stores the LongRoPE factors as the tensors
rope_factors_long/short (read into the config here), the rotated dims as rope.dimension_count
and the attention factor as rope.scaling.attn_factor. Phi-3 is a NEOX-RoPE arch: no Q/K
row permutation."""

from __future__ import annotations

from typing import Any

from engine.model.family import Family, GGUFMetadata, Support, partial_rotary_from_hf
from engine.model.registry import register


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"partial_rotary_factor": partial_rotary_from_hf(cfg), "attention_bias": False}


def gguf_fields(gguf: GGUFMetadata) -> dict[str, Any]:
    heads = int(gguf.arch_field("attention.head_count"))
    head_dim = int(gguf.arch_field("attention.key_length", int(gguf.arch_field("embedding_length")) // heads))
    rotary = int(gguf.arch_field("rope.dimension_count", head_dim))
    out: dict[str, Any] = {"partial_rotary_factor": rotary / head_dim}
    long, short = gguf.tensor_values("rope_factors_long"), gguf.tensor_values("rope_factors_short")
    if long is not None and short is not None:
        out["rope_scaling"] = {
            "rope_type": "longrope", "long_factor": long, "short_factor": short,
            "original_max_position_embeddings": int(gguf.arch_field("rope.scaling.original_context_length")),
            "attention_factor": float(gguf.arch_field("rope.scaling.attn_factor", 1.0)),
        }
    return out


FAMILY = register(Family(
    model_type="phi3", gguf_arch="phi3", hf_fields=hf_fields, gguf_fields=gguf_fields,
    gguf_tensors={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    gguf_config_tensors=("rope_factors_long", "rope_factors_short"),
    support=Support(proved=("folder", "converter Q8_0", "GGUF F32", "LongRoPE short + long",
                            "int8/int4 gate")),
    notes="fused qkv/gate_up checkpoints; LongRoPE; partial rotary",
))
