"""Mixtral: Llama layers (no q/k norm, Mistral's optional sliding window) with the sparse MoE
block (engine/model/moe.py) on every layer, each expert `intermediate_size` wide, its top-k
weights always renormalised (transformers' MixtralTopKRouter).

Checkpoints name the block `block_sparse_moe` and its experts' projections w1 (gate), w3 (up)
and w2 (down); moe.mixtral_names maps them onto the shared block's names. llama.cpp writes
Mixtral as arch `llama` with stacked expert tensors, which registry.py's llama GGUF adapter
turns into this family.
"""

from __future__ import annotations

from typing import Any

from engine.model.family import Family, Support
from engine.model.qwen3_moe import experts_from_hf
from engine.model.registry import register


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"attention_bias": cfg.get("attention_bias", False), "sliding_window": cfg.get("sliding_window"),
            "num_experts": experts_from_hf(cfg), "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["intermediate_size"]), "norm_topk_prob": True}


def gguf_moe_fields(gguf: Any) -> dict[str, Any]:
    """A llama GGUF with experts is a Mixtral: llama.cpp's llama graph renormalises the top-k
    weights, and its experts are as wide as feed_forward_length unless the file says otherwise."""
    return {"architecture": "mixtral", "num_experts": int(gguf.arch_field("expert_count")),
            "num_experts_per_tok": int(gguf.arch_field("expert_used_count")),
            "moe_intermediate_size": int(gguf.arch_field("expert_feed_forward_length")
                                         or gguf.arch_field("feed_forward_length")),
            "norm_topk_prob": True}


# llama.cpp's names for the MoE block, in a llama-arch GGUF.
GGUF_TENSORS = {"ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
                "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj"}

FAMILY = register(Family(
    model_type="mixtral", gguf_arch=None, model_class="engine.model.qwen3_moe:Qwen3MoeForCausalLM",
    hf_fields=hf_fields,
    support=Support(fused_cpu_step=False, proved=("folder", "converter Q8_0", "GGUF Q8_0 (arch llama, experts F32)",
                                                  "int8/int4 gate")),
    notes="MoE as qwen3_moe, top-k always renormalised; block_sparse_moe w1/w3/w2 names; "
          "GGUF: arch llama with expert tensors",
))
