"""The families that run llama.py as it is, told apart only by their config: llama, mistral
(a sliding window on every layer) and qwen2 (Q/K/V bias, windows on the upper layers)."""

from __future__ import annotations

from typing import Any

from engine.model import mixtral
from engine.model.family import Family, GGUFMetadata, Support
from engine.model.qwen_window import window_fields
from engine.model.registry import register


def _llama_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": cfg.get("attention_bias", False)}


def _llama_gguf_fields(gguf: GGUFMetadata) -> dict[str, Any]:
    """llama.cpp writes Mixtral as arch llama: a file with experts is served as one."""
    return {} if gguf.arch_field("expert_count") is None else mixtral.gguf_moe_fields(gguf)


def _mistral_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """Mistral's sliding window applies to every layer (transformers' sliding-window mask)."""
    return {**_llama_fields(cfg), "sliding_window": cfg.get("sliding_window")}


def _qwen2_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": cfg.get("attention_bias", True),  # Qwen2 always has Q/K/V bias
            **window_fields(cfg)}


LLAMA = register(Family(model_type="llama", gguf_arch="llama", hf_fields=_llama_fields, permute_qk=True,
                        gguf_fields=_llama_gguf_fields, gguf_tensors=mixtral.GGUF_TENSORS,
                        support=Support(proved=("folder", "GGUF Q8_0", "GGUF Q4_K_M",
                                                "converter Q8_0; llama-quantize Q4_0, Q4_K_M, Q5_K_M, Q6_K",
                                                "int8/int4 gate",
                                                "RoPE llama3, yarn, linear: folder + GGUF", "dynamic: folder",
                                                "bf16, fp16, sharded, tied")),
                        notes="RoPE scaling: linear, llama3, yarn, dynamic (up to max_position_embeddings)"))
MISTRAL = register(Family(model_type="mistral", gguf_arch=None, hf_fields=_mistral_fields,
                          support=Support(proved=("folder", "converter Q8_0",
                                                  "sliding window: folder, Triton, KV blocks freed")),
                          notes="llama.cpp writes Mistral as arch llama (no window in its GGUF); sliding_window on "
                                "every layer"))
QWEN2 = register(Family(model_type="qwen2", gguf_arch="qwen2", hf_fields=_qwen2_fields,
                        notes="Q/K/V bias; use_sliding_window: a window on layers >= max_window_layers",
                        support=Support(proved=("folder", "converter Q8_0", "GGUF F32", "int8/int4 gate",
                                                "sliding window layers: folder"))))
