"""OLMo 2: norms after attention and after the MLP, none before; RMSNorm on the whole q and k
projections (ModelConfig.qk_norm "proj").

Its layer adds x + norm(attn(x)), then x + norm(mlp(x)), so the residual add cannot fuse
into a following norm as in Llama's layer: the layer returns the whole stream.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.family import Family, Support
from engine.model.layers import RMSNorm, RotaryEmbedding
from engine.model.llama import MLP, Attention, LlamaForCausalLM, SublayerNorms
from engine.model.registry import register


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, rope, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, None]:
        """(the whole residual stream, None): nothing is left for the next layer to add."""
        x = x + self.post_attention_layernorm(self.self_attn(positions, x, kv_cache, meta))[0]
        x = x + self.post_feedforward_layernorm(self.mlp(x))[0]
        return x, None

    def sublayer_norms(self) -> SublayerNorms:
        return SublayerNorms(None, self.post_attention_layernorm, None, self.post_feedforward_layernorm)


class Olmo2ForCausalLM(LlamaForCausalLM):
    def make_layer(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> nn.Module:
        return Olmo2DecoderLayer(cfg, rope, backend)


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qk_norm": "proj", "post_norms_only": True, "attention_bias": cfg.get("attention_bias", False)}


def gguf_fields(_: Any) -> dict[str, Any]:
    return {"qk_norm": "proj", "post_norms_only": True}


FAMILY = register(Family(
    model_type="olmo2", gguf_arch="olmo2", model_class="engine.model.olmo2:Olmo2ForCausalLM",
    hf_fields=hf_fields, gguf_fields=gguf_fields,
    gguf_tensors={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                  "post_attention_norm": "post_attention_layernorm",
                  "post_ffw_norm": "post_feedforward_layernorm"},
    support=Support(proved=("folder", "converter Q8_0", "GGUF Q8_0", "int8/int4 gate")),
    notes="post-norms only; q/k RMSNorm over the whole projection",
))
