"""Attention for the CPU (`--attention-backend cpu`, the CPU default): the sdpa backend
with the C++ kernels where they apply.

Decodes go to a C++ kernel that reads K/V in place through the block tables, and RoPE +
the K/V cache write are one C++ pass (cpu_kernels/paged_attention.py); where they are not
built (no compiler, PAGODE_CPU_KERNEL=0, a CPU below AVX2) or do not apply (CUDA, fp32
queries only), the pure-torch paths of SdpaAttentionBackend run. Prefill and extend chunks
go to the fused C++ prefill kernel (cpu_kernels/prefill_attention.py) or attend without an
explicit mask through torch's flash kernel (maskless_prefill.py), whichever won the race at
load for the model's attention shape (prefill_choice.py); windowed or soft-capped chunks take
the kernel, or without it the sdpa backend's masked path. A chunk as big as the steps whose
projections run bf16 GEMMs takes the kernel's bf16 products where it has them (AMX tiles,
AVX512-BF16), raced against the maskless path on its own.
"""

from __future__ import annotations

import torch

from engine import native
from engine.attention import kv_int8, maskless_prefill, prefill_choice
from engine.attention.metadata import AttentionMetadata
from engine.attention.sdpa_backend import SdpaAttentionBackend


def shortest_extend(meta: AttentionMetadata) -> int:
    """The fewest new rows of a sequence in the step's prefill part (after its decodes)."""
    starts = meta.query_start_loc_cpu[meta.num_decodes:]
    return min((b - a for a, b in zip(starts, starts[1:], strict=False)), default=0)


class CpuAttentionBackend(SdpaAttentionBackend):
    name = "cpu"

    def __init__(self) -> None:
        self.kernel = native.paged_attention()  # None: pure torch throughout
        self.prefill_kernel = native.prefill_attention()
        self.bf16_from: int | None = None  # steps of this many tokens on take bf16 products

    def prepare(self, num_heads: int, dtype: torch.dtype, kv_cache: torch.Tensor,
                bf16_from: int | None = None) -> None:
        """Race the prefill paths for the model's shape now, at load, not at the first request
        (and, where big steps will take bf16 products, those too)."""
        self.bf16_from = bf16_from
        head_dim = kv_int8.head_dim(kv_cache)
        query = torch.empty(0, num_heads, head_dim, dtype=dtype, device=kv_cache.device)
        prefill_choice.use_kernel(self.prefill_kernel, query, kv_cache, False, self.prefill_maskless)
        if bf16_from is not None and prefill_choice.wants_bf16(self.prefill_kernel, bf16_from, head_dim,
                                                               kv_cache.dtype, bf16_from):
            prefill_choice.use_kernel(self.prefill_kernel, query, kv_cache, False, self.prefill_maskless, bf16=True)

    def prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        masked = window is not None or softcap is not None
        bf16 = prefill_choice.wants_bf16(self.prefill_kernel, query.shape[0], query.shape[-1], kv_cache.dtype,
                                         self.bf16_from, shortest_extend(meta))
        if not prefill_choice.use_kernel(self.prefill_kernel, query, kv_cache, masked, self.prefill_maskless,
                                         bf16):
            return super().prefill(query, kv_cache, meta, scale, window=window, softcap=softcap)
        assert self.prefill_kernel is not None
        nd = meta.num_decodes
        starts = meta.query_start_loc[nd:] - meta.query_start_loc[nd]
        return self.prefill_kernel.prefill(query, kv_cache, meta.block_tables[nd:], starts, meta.seq_lens[nd:],
                                           scale, window=window, softcap=softcap, bf16=bf16)

    def prefill_maskless(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                         scale: float) -> torch.Tensor:
        """The torch path of an unwindowed, uncapped prefill: gather, then maskless_prefill."""
        return super().prefill(query, kv_cache, meta, scale)

    def decode(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        if self.kernel is not None and self.kernel.supports(query.dtype, kv_cache.dtype, query.device):
            nd = meta.num_decodes
            return self.kernel.decode(query, kv_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
                                      window=window, softcap=softcap)
        return self.decode_gathered(query, kv_cache, meta, scale, window=window, softcap=softcap)

    def attend_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int,
                      scale: float) -> torch.Tensor:
        if maskless_prefill.supported(q):
            return maskless_prefill.attend_causal(q, k, v, context, scale)
        return super().attend_causal(q, k, v, context, scale)

    def rotate_and_write_kv(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                            num_heads: int) -> torch.Tensor:
        if self.kernel is not None and self.kernel.can_rope_write(qkv, kv_cache, positions, cos):
            return self.kernel.rope_write_kv(qkv, positions, cos, sin, kv_cache, slot_mapping, num_heads)
        return super().rotate_and_write_kv(qkv, positions, cos, sin, kv_cache, slot_mapping, num_heads)

    def supports_fused_cpu_step(self, kv_cache: torch.Tensor) -> bool:
        """The fused step attends and writes K/V with this backend's own C++ kernels."""
        kv_heads, head_dim = kv_cache.shape[3], kv_int8.head_dim(kv_cache)
        return (self.kernel is not None and kv_cache.is_contiguous()
                and self.kernel.supports(torch.float32, kv_cache.dtype, kv_cache.device)
                and kv_heads * head_dim <= self.kernel.MAX_KV_ROW)
