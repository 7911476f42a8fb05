"""Gemma 3 (text): Gemma 2's model (gemma2.py) with per-head q/k norms, no soft-caps by
default, and the sliding layers on their own RoPE base (rope_local_base_freq, or
rope_parameters["sliding_attention"] in transformers v5)."""

from __future__ import annotations

from typing import Any

from engine.model import gemma2
from engine.model.family import Family, Support
from engine.model.registry import register


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    rope = cfg.get("rope_parameters") or {}
    full = rope.get("full_attention") or {}
    local = rope.get("sliding_attention") or {}
    scaling = {k: v for k, v in full.items() if k != "rope_theta"}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return {**gemma2.hf_fields(cfg), "qk_norm": "head",
            "rope_theta": float(full.get("rope_theta", cfg.get("rope_theta", 1_000_000.0))),
            "rope_scaling": None if kind == "default" else {**scaling, "rope_type": kind},
            "rope_local_theta": float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)))}


LLAMA_CPP_PATTERN = 6  # llama.cpp's gemma3: every 6th layer global, the rest sliding
LLAMA_CPP_LOCAL_THETA = 10_000.0  # and the sliding layers' RoPE base, neither read from the file


def gguf_fields(gguf: Any) -> dict[str, Any]:
    layers = int(gguf.arch_field("block_count"))
    return {**gemma2.gguf_common(gguf), "qk_norm": "head", "rope_local_theta": LLAMA_CPP_LOCAL_THETA,
            "layer_types": ["full_attention" if (i + 1) % LLAMA_CPP_PATTERN == 0 else gemma2.SLIDING
                            for i in range(layers)]}


class Gemma3ForCausalLM(gemma2.Gemma2ForCausalLM):
    pass


FAMILY = register(Family(
    model_type="gemma3_text", gguf_arch="gemma3", model_class="engine.model.gemma3:Gemma3ForCausalLM",
    gguf_fields=gguf_fields, gguf_tensors=gemma2.GGUF_TENSORS,
    hf_fields=hf_fields,
    support=Support(proved=("folder", "GGUF F32", "converter Q8_0, Q4_K_M", "int8/int4 gate",
                            "Triton backend")),
    notes="Gemma 2 plus q/k norms and a local RoPE base on the sliding layers",
))
