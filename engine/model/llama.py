"""Llama-family decoder with fused QKV and gate-up projections.

Forward takes the packed tokens of one engine step (prefill chunks and decodes
together) and reads/writes K/V through the attention backend. The residual stream is
carried beside the hidden state so that each residual add fuses into the next RMSNorm;
RoPE fuses with the K/V cache write (engine/model/layers.py).

Most families run on this class, each toggling features through ModelConfig fields
(q/k norms, partial rotary, layers without RoPE, Granite's multipliers); a family whose
layer has another shape subclasses it and overrides make_layer (engine/model/olmo2.py).
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.model import fused_ops
from engine.model.config import ModelConfig
from engine.model.layers import (
    PagedAttention,
    RMSNorm,
    RotaryCacheWrite,
    RotaryEmbedding,
    SiluAndMul,
    rotate_half_order,
)
from engine.quant.linear import QuantLinear


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = cfg.attention_scale
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm, self.k_norm = qk_norms(cfg)
        self.rope = rope
        self.backend = backend
        self.rotary_cache_write = RotaryCacheWrite(rope, backend, self.num_heads)
        self.attn = PagedAttention(backend, self.scale, window=cfg.sliding_window)

    def forward(self, positions: torch.Tensor, x: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if self.q_norm is not None and self.k_norm is not None:
            qkv = self.normalize_qk(qkv, self.q_norm, self.k_norm)
        q = self.rotary_cache_write(positions, qkv, kv_cache, meta)
        out = self.attn(q, kv_cache, meta)
        return self.o_proj(out.reshape(-1, self.q_size))

    def normalize_qk(self, qkv: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm) -> torch.Tensor:
        """RMSNorm on the queries and keys before RoPE, per head or over the whole projection
        (the norm's size says which), in place in the projection's output where the C++
        kernel takes it: no split, copies and join of the step's widest rows but one."""
        return fused_ops.qk_rms_norm(qkv, self.q_size, self.kv_size, q_norm.kernel_weight(), k_norm.kernel_weight(),
                                     q_norm.eps, q_norm.kernel)


def qk_norms(cfg: ModelConfig) -> tuple[RMSNorm | None, RMSNorm | None]:
    if cfg.qk_norm is None:
        return None, None
    if cfg.qk_norm == "head":
        return RMSNorm(cfg.head_dim, cfg.rms_norm_eps), RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
    if cfg.qk_norm == "proj":
        kv = cfg.num_key_value_heads * cfg.head_dim
        return RMSNorm(cfg.num_attention_heads * cfg.head_dim, cfg.rms_norm_eps), RMSNorm(kv, cfg.rms_norm_eps)
    raise ValueError(f"unknown qk_norm {cfg.qk_norm!r}; expected 'head' or 'proj'")


class MLP(nn.Module):
    activation = "silu"  # the gate's function, for the fused decode step

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if runs_bf16(self.gate_up_proj, self.down_proj, self.act_fn.kernel, x.shape[0]):
            return self.down_proj(self.act_fn(self.gate_up_proj(x.to(torch.bfloat16)))).float()
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


def runs_bf16(gate_up: nn.Module, down: nn.Module, kernel: object, tokens: int) -> bool:
    """Whether an MLP of `tokens` rows may keep its gate-up output in bf16: both projections
    run oneDNN's bf16 GEMM at this size, and the C++ activation takes bf16 rows. The values
    are those of casting around each op (the GEMMs round their inputs to bf16 anyway, and
    the activation's bf16 rows round as torch does), without the two casts of the widest
    tensor of the layer: a 512-token chunk's gate-up output is 25 MB in fp32."""
    return (kernel is not None and isinstance(gate_up, QuantLinear) and isinstance(down, QuantLinear)
            and gate_up.bf16_path(tokens) and down.bf16_path(tokens))


class SublayerNorms(NamedTuple):
    """A layer's RMSNorms around its attention and MLP, None where it has none: Llama's come
    before each sublayer, OLMo 2's after, Gemma's both. What the fused decode step needs to
    compute a layer it did not build."""

    before_attention: RMSNorm | None
    after_attention: RMSNorm | None
    before_mlp: RMSNorm | None
    after_mlp: RMSNorm | None


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, rope, backend)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor | None,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it); the next layer adds them."""
        h, residual = self.input_layernorm(x, residual)
        h = self.scale_residual(self.self_attn(positions, h, kv_cache, meta))
        h, residual = self.post_attention_layernorm(h, residual)
        return self.scale_residual(self.mlp(h)), residual

    def sublayer_norms(self) -> SublayerNorms:
        return SublayerNorms(self.input_layernorm, None, self.post_attention_layernorm, None)

    def scale_residual(self, h: torch.Tensor) -> torch.Tensor:
        """Granite adds out * residual_multiplier to the stream; the product is taken here so
        that the add still fuses into the next norm."""
        return h if self.residual_multiplier == 1.0 else h * self.residual_multiplier


class LlamaForCausalLM(nn.Module):
    # HF weight name fragment -> (our fused parameter fragment, shard index)
    packed_modules_mapping: dict[str, tuple[str, int]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.config = cfg
        rope = self.rope = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling,
                                           cfg.rotary_dim, cfg.max_position_embeddings)
        uses_rope = cfg.rope_layers or [True] * cfg.num_hidden_layers
        # Layers without RoPE rotate by an identity table, so they keep the fused cache write.
        self.nope = (RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, identity=True)
                     if not all(uses_rope) else None)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.make_layer(cfg, rope if use or self.nope is None else self.nope, backend)
                                    for use in uses_rope)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.window_sliding_layers()

    def window_sliding_layers(self) -> None:
        """With layer_types, only the layers it calls sliding keep the window (Qwen2's from
        max_window_layers on); without, every layer has the config's window (Mistral)."""
        cfg = self.config
        if cfg.layer_types is None:
            return
        for layer, kind in zip(self.layers, cfg.layer_types, strict=True):
            attn = cast(Attention, layer.get_submodule("self_attn"))
            attn.attn.window = cfg.sliding_window if kind == "sliding_attention" else None

    def make_layer(self, cfg: ModelConfig, rope: RotaryEmbedding, backend: AttentionBackend) -> nn.Module:
        return DecoderLayer(cfg, rope, backend)

    def build_rope(self) -> None:
        """(Re)compute the cos/sin tables on the current default device."""
        self.rope.build()
        if self.nope is not None:
            self.nope.build()

    def finish_loading(self) -> None:
        """Reorder each head's Q/K rows for partial rotary (see rotate_half_order), once the
        checkpoint's weights are in."""
        cfg = self.config
        if cfg.rotary_dim == cfg.head_dim:
            return
        order = rotate_half_order(cfg.head_dim, cfg.rotary_dim)
        q_rows = (torch.arange(cfg.num_attention_heads).unsqueeze(1) * cfg.head_dim + order).flatten()
        k_rows = (torch.arange(cfg.num_key_value_heads).unsqueeze(1) * cfg.head_dim + order).flatten()
        q_size, kv_size = q_rows.numel(), k_rows.numel()
        rows = torch.cat([q_rows, q_size + k_rows, torch.arange(q_size + kv_size, q_size + 2 * kv_size)])
        with torch.no_grad():
            for layer in self.layers:
                attn = cast(Attention, layer.get_submodule("self_attn"))
                attn.qkv_proj.weight.copy_(attn.qkv_proj.weight[rows])
                if attn.qkv_proj.bias is not None:
                    attn.qkv_proj.bias.copy_(attn.qkv_proj.bias[rows])
                for norm, proj_rows in ((attn.q_norm, q_rows), (attn.k_norm, k_rows)):
                    if norm is not None:  # a per-head norm moves like one head, a whole-projection one like the rows
                        index = order if norm.weight.numel() == cfg.head_dim else proj_rows
                        norm.weight.copy_(norm.weight[index])

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        x = self.embed(input_ids)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(positions, x, residual, kv_cache, meta)
        return self.norm(x, residual)[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        multiplier = self.config.embedding_multiplier
        return x if multiplier == 1.0 else x * multiplier

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        scaling = self.config.logits_scaling
        return logits if scaling == 1.0 else logits / scaling
