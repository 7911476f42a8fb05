"""Gemma 2: embeddings scaled by sqrt(hidden), RMSNorm with (1 + w) in fp32, GeGLU (tanh
GELU), four norms per layer, query_pre_attn_scalar as the softmax scale, sliding-window
layers interleaved with global ones (layer_types), attention and final logit soft-caps.

Its layer adds x + norm(attn(norm(x))), then x + norm(mlp(norm(x))), so, as OLMo 2's, it
returns the whole residual stream. Gemma 3 (gemma3.py) is this model with q/k norms and
its own RoPE base on the sliding layers.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from engine import native
from engine.attention import AttentionBackend, AttentionMetadata
from engine.model import fused_ops
from engine.model.config import ModelConfig
from engine.model.family import Family, Support
from engine.model.layers import RMSNorm, RotaryEmbedding
from engine.model.llama import Attention, LlamaForCausalLM, SublayerNorms, runs_bf16
from engine.model.registry import register

SLIDING = "sliding_attention"


class GemmaRMSNorm(RMSNorm):
    """x / rms(x) * (1 + w), all in fp32, then back to x's dtype: transformers' arithmetic
    (Llama's norm multiplies in x's dtype, which would part from it in bf16). Returns
    (norm(x + residual), x + residual) as the Llama norm does.

    On fp32 CPU rows it is Llama's C++ norm on the weights 1 + w (kernel_weight), the
    arithmetic that the fused decode step runs, so that both paths give the same numbers."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if (self.kernel is not None and self.kernel.applies(x)
                and (residual is None or residual.is_contiguous())):
            return self.kernel.add_rms_norm(x, residual, self.kernel_weight(), self.eps)
        if residual is not None:
            x = x + residual
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x), x

    def kernel_weight(self) -> torch.Tensor:
        return 1.0 + self.weight.detach().float()


class GemmaMLP(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), gate and up fused as Llama's."""

    activation = "gelu_tanh"  # the gate's function, for the fused decode step

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.kernel = native.fused_ops()  # None: torch ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if runs_bf16(self.gate_up_proj, self.down_proj, self.kernel, x.shape[0]):
            h = self.gate_up_proj(x.to(torch.bfloat16))
            return self.down_proj(fused_ops.gelu_tanh_and_mul(h, self.kernel)).float()
        return self.down_proj(fused_ops.gelu_tanh_and_mul(self.gate_up_proj(x), self.kernel))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.self_attn = Attention(cfg, rope, backend)
        if cfg.qk_norm == "head":  # gemma3: per-head norms of the Gemma kind
            self.self_attn.q_norm = GemmaRMSNorm(cfg.head_dim, eps)
            self.self_attn.k_norm = GemmaRMSNorm(cfg.head_dim, eps)
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.mlp = GemmaMLP(cfg)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, None]:
        """(the whole residual stream, None): nothing is left for the next layer to add."""
        h = self.self_attn(positions, self.input_layernorm(x)[0], kv_cache, meta)
        x = x + self.post_attention_layernorm(h)[0]
        h = self.mlp(self.pre_feedforward_layernorm(x)[0])
        return x + self.post_feedforward_layernorm(h)[0], None

    def sublayer_norms(self) -> SublayerNorms:
        return SublayerNorms(self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm,
                             self.post_feedforward_layernorm)


class Gemma2ForCausalLM(LlamaForCausalLM):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__(cfg, backend, max_positions)
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.local_rope = (RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_local_theta)
                           if cfg.rope_local_theta is not None else None)
        kinds = cfg.layer_types or [SLIDING] * cfg.num_hidden_layers
        for layer, kind in zip(self.layers, kinds, strict=True):
            attn = cast(Attention, layer.get_submodule("self_attn"))
            attn.attn.window = cfg.sliding_window if kind == SLIDING else None
            attn.attn.softcap = cfg.attn_logit_softcapping
            if kind == SLIDING and self.local_rope is not None:
                attn.rope = attn.rotary_cache_write.rope = self.local_rope

    def make_layer(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> nn.Module:
        return GemmaDecoderLayer(cfg, rope, backend)

    def finish_loading(self) -> None:
        """A GGUF holds each norm weight as 1 + w (llama.cpp's converter adds the 1, so its
        kernels multiply by w): take it back off, since these norms add it themselves."""
        super().finish_loading()
        if self.config.norms_stored_plus_one:
            with torch.no_grad():
                for module in self.modules():
                    if isinstance(module, GemmaRMSNorm):
                        module.weight.sub_(1.0)

    def build_rope(self) -> None:
        super().build_rope()
        if self.local_rope is not None:
            self.local_rope.build()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Scaled by sqrt(hidden) rounded to the weights' dtype, as transformers does."""
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(self.config.hidden_size ** 0.5).to(x.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


def hf_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"sliding_window": cfg.get("sliding_window"), "layer_types": cfg.get("layer_types"),
            "attn_logit_softcapping": cfg.get("attn_logit_softcapping"),
            "final_logit_softcapping": cfg.get("final_logit_softcapping"),
            "attention_multiplier": float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
            "attention_bias": cfg.get("attention_bias", False),
            "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6),
            "tie_word_embeddings": cfg.get("tie_word_embeddings", True)}


# GGUF: llama.cpp names the four norms and q/k norms these; its gemma2 graph makes every even
# layer a sliding one and takes the softmax scale from the head size (so a GGUF stands for a
# model whose query_pre_attn_scalar is its head_dim).
GGUF_TENSORS = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm",
                "attn_k_norm": "self_attn.k_norm"}


def gguf_common(gguf: Any) -> dict[str, Any]:
    head_dim = int(gguf.arch_field("attention.key_length"))
    window = gguf.arch_field("attention.sliding_window")
    return {"sliding_window": None if window is None else int(window), "norms_stored_plus_one": True,
            "attention_multiplier": head_dim ** -0.5, "rms_norm_eps": float(
                gguf.arch_field("attention.layer_norm_rms_epsilon", 1e-6))}


def gguf_fields(gguf: Any) -> dict[str, Any]:
    layers = int(gguf.arch_field("block_count"))
    attn_cap, final_cap = gguf.arch_field("attn_logit_softcapping"), gguf.arch_field("final_logit_softcapping")
    return {**gguf_common(gguf),
            "layer_types": [SLIDING if i % 2 == 0 else "full_attention" for i in range(layers)],
            "attn_logit_softcapping": None if attn_cap is None else float(attn_cap),
            "final_logit_softcapping": None if final_cap is None else float(final_cap)}


FAMILY = register(Family(
    model_type="gemma2", gguf_arch="gemma2", model_class="engine.model.gemma2:Gemma2ForCausalLM",
    gguf_fields=gguf_fields, gguf_tensors=GGUF_TENSORS,
    hf_fields=hf_fields,
    support=Support(proved=("folder", "converter Q8_0", "GGUF F32", "int8/int4 gate", "Triton backend")),
    notes="sliding and global layers (layer_types); attention and final logit soft-caps; (1 + w) norms",
))
