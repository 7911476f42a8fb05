"""SmolLM3: Llama layers, some without RoPE.

transformers' `no_rope_layers[i] == 1` means layer i USES RoPE (the name says the opposite);
by default every `no_rope_layer_interval`-th layer (4: layers 3, 7, 11, ...) has none.
llama.cpp hard-codes that interval of 4, so a GGUF carries no per-layer list."""

from __future__ import annotations

from typing import Any

from engine.model.family import Family, GGUFMetadata, Support
from engine.model.registry import register

LLAMA_CPP_NO_ROPE_STEP = 4


def rope_layers_by_interval(num_layers: int, interval: int) -> list[bool]:
    return [(i + 1) % interval != 0 for i in range(num_layers)]


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    layers = cfg.get("no_rope_layers")
    if layers is None:
        uses = rope_layers_by_interval(cfg["num_hidden_layers"], cfg.get("no_rope_layer_interval", 4))
    else:
        uses = [bool(flag) for flag in layers]
    return {"rope_layers": uses, "attention_bias": cfg.get("attention_bias", False)}


def gguf_fields(gguf: GGUFMetadata) -> dict[str, Any]:
    return {"rope_layers": rope_layers_by_interval(int(gguf.arch_field("block_count")), LLAMA_CPP_NO_ROPE_STEP)}


FAMILY = register(Family(
    model_type="smollm3", gguf_arch="smollm3", hf_fields=hf_fields, gguf_fields=gguf_fields,
    permute_qk=True, support=Support(proved=("folder", "converter Q8_0", "GGUF F32", "int8/int4 gate")),
    notes="NoPE layers (no_rope_layers[i] == 0); GGUF: every 4th layer, as llama.cpp",
))
