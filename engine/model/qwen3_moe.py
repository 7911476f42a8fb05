"""Qwen3-MoE (and OLMoE, engine/model/olmoe.py, on the same class): Qwen3's layers (per-head
q/k RMSNorm, no QKV bias) with the sparse MoE block (engine/model/moe.py) in place of the MLP
on the layers ModelConfig.is_sparse_layer names; the others keep a dense MLP of
`intermediate_size`."""

from __future__ import annotations

from typing import Any

from engine.attention import AttentionBackend
from engine.model.config import ModelConfig
from engine.model.family import Family, Support
from engine.model.llama import LlamaForCausalLM
from engine.model.moe import SparseMoeBlock
from engine.model.registry import register


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__(cfg, backend, max_positions)
        for i, layer in enumerate(self.layers):
            if cfg.is_sparse_layer(i):
                layer.mlp = moe_block(cfg)


def moe_block(cfg: ModelConfig) -> SparseMoeBlock:
    return SparseMoeBlock(cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                          cfg.norm_topk_prob)


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qk_norm": "head", "attention_bias": cfg.get("attention_bias", False),
            "num_experts": experts_from_hf(cfg), "num_experts_per_tok": int(cfg["num_experts_per_tok"]),
            "moe_intermediate_size": int(cfg["moe_intermediate_size"]),
            # transformers' class default is False (ANCHORS-3 section 1); hub configs set it
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
            "decoder_sparse_step": int(cfg.get("decoder_sparse_step", 1)),
            "mlp_only_layers": list(cfg.get("mlp_only_layers") or [])}


def experts_from_hf(cfg: dict[str, Any]) -> int:
    """transformers 5 writes `num_local_experts` (its attribute map's name for num_experts);
    hub configs say `num_experts`."""
    return int(cfg.get("num_experts") or cfg["num_local_experts"])


def gguf_fields(gguf: Any) -> dict[str, Any]:
    """llama.cpp's qwen3moe makes every layer sparse and always renormalises the top-k weights."""
    return {"qk_norm": "head", "num_experts": int(gguf.arch_field("expert_count")),
            "num_experts_per_tok": int(gguf.arch_field("expert_used_count")),
            "moe_intermediate_size": int(gguf.arch_field("expert_feed_forward_length")),
            "norm_topk_prob": True}


FAMILY = register(Family(
    model_type="qwen3_moe", gguf_arch="qwen3moe", model_class="engine.model.qwen3_moe:Qwen3MoeForCausalLM",
    hf_fields=hf_fields, gguf_fields=gguf_fields,
    gguf_tensors={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                  "ffn_gate_inp": "mlp.gate", "ffn_gate_exps": "mlp.experts.gate_proj",
                  "ffn_up_exps": "mlp.experts.up_proj", "ffn_down_exps": "mlp.experts.down_proj"},
    support=Support(fused_cpu_step=False, proved=("folder", "converter Q8_0", "GGUF Q8_0 (experts F32)",
                                                  "int8/int4 gate")),
    notes="softmax top-k routing, one GEMM per active expert per step; per-head q/k RMSNorm",
))
