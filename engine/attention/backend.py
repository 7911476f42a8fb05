"""The one interface the model calls; backends never leak into the model.

Which backend a device gets is engine/attention/selection.py's; this module knows none
of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from engine.attention import kv_int8
from engine.attention.metadata import AttentionMetadata
from engine.attention.rope import apply_rope


class AttentionBackend(ABC):
    name: str = "abstract"

    @abstractmethod
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Scatter key/value [T, kv_heads, head_dim] into the paged cache."""

    @abstractmethod
    def decode(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """query [num_decodes, heads, head_dim] -> same shape; one new token per sequence.

        window: a query at position p sees only keys at positions > p - window (the last
        `window` positions, itself included), as transformers' sliding-window mask;
        softcap: scores (already scaled) become softcap * tanh(score / softcap) before the
        mask, as Gemma 2. None: neither.
        """

    @abstractmethod
    def prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """query [prefill_tokens, heads, head_dim] of the chunks after the decodes.

        Causal within each chunk, full over the sequence's cached positions (window and
        softcap as in decode).
        """

    def rotate_and_write_kv(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                            num_heads: int) -> torch.Tensor:
        """RoPE on a step's queries and keys, and the K/V cache write: returns the rotated
        queries [T, heads, head_dim].

        qkv [T, (heads + 2 kv_heads) head_dim] is the fused projection's output; cos, sin
        [max_positions, head_dim / 2] the rotary tables. By default, RoPE in torch then
        write_kv; a backend may fuse the two.
        """
        kv_heads, head_dim = kv_cache.shape[3], kv_int8.head_dim(kv_cache)
        q, k, v = qkv.split([num_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q, k = apply_rope(positions, q.view(-1, num_heads, head_dim), k.view(-1, kv_heads, head_dim), cos, sin)
        self.write_kv(k, v.view(-1, kv_heads, head_dim).contiguous(), kv_cache, slot_mapping)
        return q

    def prepare(self, num_heads: int, dtype: torch.dtype, kv_cache: torch.Tensor,
                bf16_from: int | None = None) -> None:
        """Called once at load with the model's query heads, its activations' dtype and a layer's
        cache: a backend that chooses among its paths by measurement does so here. bf16_from:
        the fewest tokens of a step from which the model's projections run in bf16 (None:
        never), which a backend may follow with bf16 attention. Nothing by default."""
        return None

    def supports_fused_cpu_step(self, kv_cache: torch.Tensor) -> bool:
        """Whether the fused C++ decode step (engine/model/decode_step.py) may stand in for
        this backend on this cache: it attends with the same C++ kernel, so the numbers stay
        the same. No by default."""
        return False

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, *,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """Write the step's K/V into the cache, then attend."""
        self.write_kv(key, value, kv_cache, meta.slot_mapping)
        return self.attend(query, kv_cache, meta, scale, window=window, softcap=softcap)

    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """Decodes then prefill chunks, over a cache that already holds the step's K/V.

        The cache may be stored in a narrower dtype than the query (--kv-cache-dtype), or
        in int8 with a scale per row (kv_int8.py); backends convert as they read.
        """
        nd = meta.num_decodes
        if meta.num_prefills == 0:
            return self.decode(query, kv_cache, meta, scale, window=window, softcap=softcap)
        if nd == 0:
            return self.prefill(query, kv_cache, meta, scale, window=window, softcap=softcap)
        return torch.cat([self.decode(query[:nd], kv_cache, meta, scale, window=window, softcap=softcap),
                          self.prefill(query[nd:], kv_cache, meta, scale, window=window, softcap=softcap)])
