"""Bidirectional encoders: BERT (all-MiniLM, bge, e5), XLM-RoBERTa (bge-m3, multilingual-e5)
and nomic-bert (rotary positions, SwiGLU), with the classifier heads of their cross-encoders.

Every token sees every other token of its row, so no KV cache is kept: one forward over a
batch of rows, their real tokens packed into one stream (engine/pooling/packing.py) so that
no linear layer multiplies padding, and padding masked out of the keys. The modules carry
transformers' names, so a checkpoint's tensors load by name after its model prefix is stripped.

The linear layers and attention may run in bf16 (`Encoder.use_bf16`) where the CPU has bf16
matrix units; the residual stream and the LayerNorms stay fp32, so rounding enters only the
products, and the model is served so only where it holds the quality gate
(engine/pooling/precision.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.pooling.bf16_linear import Bf16Linear, can_fuse
from engine.pooling.packing import Packing

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin [B, L, head_dim]


@dataclass(frozen=True)
class EncoderConfig:
    model_type: str  # bert, xlm-roberta or nomic_bert
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int
    rope_theta: float = 10000.0
    num_labels: int = 0  # a cross-encoder's classifier outputs; 0: no classifier

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def rotary(self) -> bool:
        return self.model_type == "nomic_bert"

    @property
    def position_offset(self) -> int:
        """XLM-RoBERTa numbers positions from padding_idx + 1 (its pad id is position 1)."""
        return self.pad_token_id + 1 if self.model_type == "xlm-roberta" else 0


def encoder_config(hf: dict[str, Any], num_labels: int = 0) -> EncoderConfig:
    rope = hf.get("rope_parameters") or {}
    return EncoderConfig(
        model_type=hf["model_type"], vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], max_positions=hf.get("max_position_embeddings", 512),
        type_vocab_size=hf.get("type_vocab_size", 2), layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        hidden_act=hf.get("hidden_act", "gelu"), pad_token_id=hf.get("pad_token_id") or 0,
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 1000.0))), num_labels=num_labels)


ACTIVATIONS = {"gelu": lambda x: F.gelu(x), "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
               "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu,
               "silu": F.silu, "swish": F.silu}


def activation(name: str) -> Any:
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not one pagode's encoders run; expected one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class Embeddings(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # Rotary encoders add no position vectors; the others learn one per position.
        self.position_embeddings = None if cfg.rotary else nn.Embedding(cfg.max_positions, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, token_types: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_types)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(positions)
        return self.LayerNorm(x)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, L, head_dim] in the rotate-half layout (halves, not adjacent pairs)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = positions[..., None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, L, d]; cos/sin [B, L, d]. Rotated in fp32 and returned in x's dtype, so
    bf16 queries and keys are rounded once, after the rotation."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing) -> torch.Tensor:
    """Bidirectional attention over [B, heads, L, d] with the padded keys masked; the real
    tokens' outputs as a [T, heads * d] stream."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=packing.keep, scale=1.0 / math.sqrt(q.shape[-1]))
    return packing.tokens(out)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)


class BertOutput(nn.Module):
    def __init__(self, width: int, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(width, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x).float() + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertOutput(cfg.hidden_size, cfg)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)


class BertLayer(nn.Module):
    """Post-norm: attention, add, LayerNorm; MLP, add, LayerNorm (BERT and XLM-RoBERTa)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.dtype = torch.float32  # what the linear layers and attention compute in
        self.act = activation(cfg.hidden_act)
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg.intermediate_size, cfg)

    def forward(self, x: torch.Tensor, packing: Packing, rope: Rope | None) -> torch.Tensor:
        """x: the [T, H] fp32 stream of real tokens."""
        proj = self.attention.self
        xs = x.to(self.dtype)
        q, k, v = (packing.heads(p(xs), self.num_heads) for p in (proj.query, proj.key, proj.value))
        h = self.attention.output(attend(q, k, v, packing), x)
        return self.output(self.act(self.intermediate.dense(h.to(self.dtype))), h)


class NomicAttention(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        width = cfg.num_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, width, bias=False)
        self.o_proj = nn.Linear(width, cfg.hidden_size, bias=False)


class NomicMLP(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x)).float()


class NomicLayer(nn.Module):
    """nomic-bert: post-norm as BERT, rotary queries and keys, a SwiGLU MLP, no biases."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.dtype = torch.float32  # what the linear layers and attention compute in
        self.self_attn = NomicAttention(cfg)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = NomicMLP(cfg)
        self.post_mlp_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, packing: Packing, rope: Rope | None) -> torch.Tensor:
        """x: the [T, H] fp32 stream of real tokens."""
        assert rope is not None
        attn = self.self_attn
        xs = x.to(self.dtype)
        q, k, v = (packing.heads(p(xs), self.num_heads) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        q, k = rotate(q, *rope), rotate(k, *rope)
        h = self.post_attention_layernorm(x + attn.o_proj(attend(q, k, v, packing)).float())
        return self.post_mlp_layernorm(h + self.mlp(h.to(self.dtype)))


class LayerStack(nn.Module):
    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        make = NomicLayer if cfg.rotary else BertLayer
        self.layer = nn.ModuleList(make(cfg) for _ in range(cfg.num_layers))


class Encoder(nn.Module):
    """Token states [B, L, H] of right-padded rows; with num_labels, also a score head."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.encoder = LayerStack(cfg)
        self.head = ClassifierHead(cfg) if cfg.num_labels else None

    def forward(self, input_ids: torch.Tensor, token_types: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """[B, L, H] fp32 token states of right-padded rows (zeros past each row's length)."""
        cfg = self.config
        packing = Packing(lengths, input_ids.shape[1])
        positions = (torch.arange(input_ids.shape[1]) + cfg.position_offset).expand_as(input_ids)
        x = self.embeddings(packing.pack(input_ids), packing.pack(positions), packing.pack(token_types))
        rope = None
        if cfg.rotary:
            rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta)
        for layer in self.encoder.layer:
            x = layer(x, packing, rope)
        return packing.pad(x)

    def use_bf16(self) -> None:
        """The layers' linear weights in bf16, their products and attention computed in bf16
        (AMX tiles or AVX512-BF16 where the CPU has them), on oneDNN's packed weights with
        BERT's activation fused into its intermediate GEMM where oneDNN has it; embeddings,
        LayerNorms, the residual stream and the classifier head stay fp32."""
        for layer in self.encoder.layer:
            assert isinstance(layer, BertLayer | NomicLayer)
            if isinstance(layer, BertLayer) and can_fuse(self.config.hidden_act):
                layer.intermediate.dense = Bf16Linear.of(layer.intermediate.dense, self.config.hidden_act)  # type: ignore[assignment]
                layer.act = identity
            for name, module in list(layer.named_modules()):
                if isinstance(module, nn.Linear):
                    replace(layer, name, Bf16Linear.of(module) if can_fuse("none") else module.to(torch.bfloat16))
            layer.dtype = torch.bfloat16

    def classify(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The cross-encoder's logits [B, num_labels] from its token states (CLS: lengths unused)."""
        assert self.head is not None
        return self.head(hidden[:, 0])


class ClassifierHead(nn.Module):
    """BERT's: tanh pooler on CLS, then a linear classifier. XLM-RoBERTa's: a tanh dense layer
    and an output projection, both named under `classifier`. Loaded as `pooler.dense` and
    `classifier` (BERT) or `classifier.dense` and `classifier.out_proj`."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.out_proj = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(cls)))


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


def replace(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)
