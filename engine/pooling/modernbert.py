"""ModernBERT (gte-modernbert, modernbert-embed, its rerankers): pre-norm layers, rotary
positions with a theta per layer kind, every third layer global and the others attending
within a window (|i - j| <= local_attention / 2), a GeGLU MLP, no biases by default, a final
norm. Its cross-encoders pool CLS or mean, then a dense-activation-norm head and a classifier.

Module names are transformers' own (`embeddings.tok_embeddings`, `layers.N.attn.Wqkv`, ...),
so a checkpoint loads by name once its `model.` prefix is stripped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.pooling.encoder import activation, rope_tables, rotate
from engine.pooling.pooler import pool


@dataclass(frozen=True)
class ModernBertConfig:
    vocab_size: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    layer_types: tuple[str, ...]  # full_attention or sliding_attention, per layer
    thetas: dict[str, float]  # rope theta per layer kind
    window: int  # a sliding layer's half window: local_attention // 2
    max_positions: int
    norm_eps: float
    norm_bias: bool
    attention_bias: bool
    mlp_bias: bool
    activation: str
    pad_token_id: int
    num_labels: int = 0
    classifier_pooling: str = "cls"
    classifier_activation: str = "gelu"
    classifier_bias: bool = False
    position_offset: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def modernbert_config(hf: dict[str, Any], num_labels: int = 0) -> ModernBertConfig:
    layers = hf["num_hidden_layers"]
    every = hf.get("global_attn_every_n_layers", 3)
    types = hf.get("layer_types") or ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    rope = hf.get("rope_parameters") or {}
    thetas = {"full_attention": float((rope.get("full_attention") or {}).get("rope_theta",
                                                                           hf.get("global_rope_theta", 160000.0))),
              "sliding_attention": float((rope.get("sliding_attention") or {}).get("rope_theta",
                                                                                 hf.get("local_rope_theta", 10000.0)))}
    return ModernBertConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"], layer_types=tuple(types), thetas=thetas,
        window=hf.get("local_attention", 128) // 2, max_positions=hf.get("max_position_embeddings", 8192),
        norm_eps=hf.get("norm_eps", 1e-5), norm_bias=hf.get("norm_bias", False),
        attention_bias=hf.get("attention_bias", False), mlp_bias=hf.get("mlp_bias", False),
        activation=hf.get("hidden_activation", "gelu"), pad_token_id=hf.get("pad_token_id") or 0,
        num_labels=num_labels, classifier_pooling=hf.get("classifier_pooling", "cls"),
        classifier_activation=hf.get("classifier_activation", "gelu"),
        classifier_bias=hf.get("classifier_bias", False))


def norm(cfg: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)


class Embeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = norm(cfg)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Attention over padded [B, heads, L, d] rows; keep [B, 1, L or 1, L] says which keys
    each query reads (a window for the local layers, so the rows stay padded here)."""
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=1.0 / math.sqrt(q.shape[-1]))
    return out.transpose(1, 2).flatten(2)


class Attention(nn.Module):
    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)


class MLP(nn.Module):
    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.act = activation(cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(value) * gate)


class Layer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, index: int) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.kind = cfg.layer_types[index]
        self.attn_norm = nn.Identity() if index == 0 else norm(cfg)  # the embeddings' norm stands in
        self.attn = Attention(cfg)
        self.mlp_norm = norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        qkv = self.attn.Wqkv(self.attn_norm(x)).unflatten(-1, (3, -1))
        q, k, v = (split_heads(qkv[..., i, :], self.num_heads) for i in range(3))
        x = x + self.attn.Wo(attend(rotate(q, *rope), rotate(k, *rope), v, keep))
        return x + self.mlp(self.mlp_norm(x))


class Head(nn.Module):
    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.classifier_bias)
        self.act = activation(cfg.classifier_activation)
        self.norm = norm(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBert(nn.Module):
    """Token states [B, L, H] of right-padded rows (after the final norm); with num_labels,
    the cross-encoder's logits too."""

    def __init__(self, cfg: ModernBertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(len(cfg.layer_types)))
        self.final_norm = norm(cfg)
        self.head = Head(cfg) if cfg.num_labels else None
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels) if cfg.num_labels else None

    def forward(self, input_ids: torch.Tensor, token_types: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        columns = torch.arange(input_ids.shape[1])
        valid = columns[None, :] < lengths[:, None]
        positions = columns.expand_as(input_ids)
        near = (columns[:, None] - columns[None, :]).abs() <= cfg.window
        # A padding row far past its row's end would see no key at all and turn NaN, which the
        # values of the next layer would carry into real rows: it sees itself instead.
        itself = torch.eye(input_ids.shape[1], dtype=torch.bool)
        masks = {"full_attention": valid[:, None, None, :],
                 "sliding_attention": (valid[:, None, None, :] & near[None, None]) | itself[None, None]}
        ropes = {kind: rope_tables(positions, cfg.head_dim, theta) for kind, theta in cfg.thetas.items()}
        x = self.embeddings.norm(self.embeddings.tok_embeddings(input_ids))
        for layer in self.layers:
            kind = str(layer.kind)
            x = layer(x, masks[kind], ropes[kind])
        return self.final_norm(x)

    def classify(self, hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        assert self.head is not None and self.classifier is not None
        return self.classifier(self.head(pool(hidden, lengths, self.config.classifier_pooling)))
