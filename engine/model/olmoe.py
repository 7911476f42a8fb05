"""OLMoE: Llama layers with RMSNorm over the whole q and k projections (ModelConfig.qk_norm
"proj") and the sparse MoE block on every layer, its experts `intermediate_size` wide and
its top-k weights renormalised only if `norm_topk_prob` (False in OLMoE-1B-7B)."""

from __future__ import annotations

from typing import Any

from engine.model import mixtral
from engine.model.family import Family, Support
from engine.model.registry import register


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("clip_qkv") is not None:
        # transformers clamps q, k and v after the norms; the fused RoPE + cache write has no clamp.
        raise ValueError(f"olmoe with clip_qkv={cfg['clip_qkv']} is not served; pagode serves clip_qkv null")
    return {"qk_norm": "proj", "attention_bias": cfg.get("attention_bias", False),
            "num_experts": int(cfg["num_experts"]), "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]),
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", False))}


def gguf_fields(gguf: Any) -> dict[str, Any]:
    """llama.cpp's olmoe graph: every layer sparse, experts feed_forward_length wide, the top-k
    weights never renormalised, and no clamp (a GGUF stands for clip_qkv null)."""
    return {"qk_norm": "proj", "num_experts": int(gguf.arch_field("expert_count")),
            "num_experts_per_tok": int(gguf.arch_field("expert_used_count")),
            "moe_intermediate_size": int(gguf.arch_field("feed_forward_length")), "norm_topk_prob": False}


FAMILY = register(Family(
    model_type="olmoe", gguf_arch="olmoe", model_class="engine.model.qwen3_moe:Qwen3MoeForCausalLM",
    hf_fields=hf_fields, gguf_fields=gguf_fields,
    gguf_tensors={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", **mixtral.GGUF_TENSORS},
    support=Support(fused_cpu_step=False, proved=("folder", "converter Q8_0", "GGUF Q8_0 (experts F32)")),
    notes="MoE as qwen3_moe; q/k RMSNorm over the whole projection; clip_qkv refused",
))
