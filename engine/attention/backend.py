"""The one interface the model calls; backends never leak into the model."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from engine import envs
from engine.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str = "abstract"

    @abstractmethod
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Scatter key/value [T, kv_heads, head_dim] into the paged cache."""

    @abstractmethod
    def decode(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        """query [num_decodes, heads, head_dim] -> same shape; one new token per sequence."""

    @abstractmethod
    def prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
        """query [prefill_tokens, heads, head_dim] of the chunks after the decodes.

        Causal within each chunk, full over the sequence's cached positions.
        """

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """Write the step's K/V into the cache, then attend."""
        self.write_kv(key, value, kv_cache, meta.slot_mapping)
        return self.attend(query, kv_cache, meta, scale)

    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float) -> torch.Tensor:
        """Decodes then prefill chunks, over a cache that already holds the step's K/V.

        The cache may be stored in a narrower dtype than the query (--kv-cache-dtype);
        backends convert as they read.
        """
        nd = meta.num_decodes
        if meta.num_prefills == 0:
            return self.decode(query, kv_cache, meta, scale)
        if nd == 0:
            return self.prefill(query, kv_cache, meta, scale)
        return torch.cat([self.decode(query[:nd], kv_cache, meta, scale),
                          self.prefill(query[nd:], kv_cache, meta, scale)])


def select_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """torch on CPU, triton on CUDA; PAGODE_ATTENTION_BACKEND or `name` overrides."""
    choice = name or envs.ATTENTION_BACKEND.get() or (
        "triton" if device.type == "cuda" else "torch")
    if choice == "torch":
        from engine.attention.torch_backend import TorchAttentionBackend
        return TorchAttentionBackend()
    if choice == "triton":
        from engine.attention.triton_backend import TritonAttentionBackend
        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {choice!r}; choose torch or triton")
