"""The CPU paged-attention kernels (src/paged_attention.cpp), bound to torch tensors.

Two entry points over the paged cache, for fp32, fp16, bf16 or int8 cache elements (the
activations stay fp32; cache rows are converted as they are read or written; an int8 row
is head_dim values then their fp32 scale, engine/attention/kv_int8.py):
decode attention that reads each sequence's blocks in place, and the fused RoPE +
K/V cache write that rotates a step's queries and keys and stores keys and values in
their slots. Built from the avx2 level up; elsewhere the library has no such symbols
and the cpu attention backend keeps its pure-torch paths.
"""

from __future__ import annotations

import ctypes

import torch

_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int8: "i8"}
SCALE_BYTES = 4  # an int8 row's fp32 scale, after its values (include/cache_types.h)
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
MAX_KV_ROW = 1024  # kv_heads * head_dim the fused cache write supports


class PagedAttentionKernel:
    """Decode attention and RoPE + K/V write over a paged cache [2, NB, BS, KVH, W]
    (W = D, or D + 4 for int8 rows and their scale)."""

    SYMBOLS = tuple(f"{fn}_{suffix}" for fn in ("paged_decode_attention", "rope_write_kv")
                    for suffix in _SUFFIX.values())
    MAX_KV_ROW = MAX_KV_ROW

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"paged_decode_attention_{suffix}")
            fn.restype, fn.argtypes = None, [_P] * 6 + [_I64] * 6 + [ctypes.c_float, _I64, ctypes.c_float,
                                                                    ctypes.c_int]
            fn = getattr(lib, f"rope_write_kv_{suffix}")
            fn.restype, fn.argtypes = None, [_P, _I64] + [_P] * 7 + [_I64] * 4 + [ctypes.c_int]

    @staticmethod
    def supports(query_dtype: torch.dtype, cache_dtype: torch.dtype, device: torch.device) -> bool:
        """Whether the kernels read this cache: on the CPU, fp32 queries, an fp32/fp16/bf16/int8 cache."""
        return device.type == "cpu" and query_dtype == torch.float32 and cache_dtype in _SUFFIX

    def decode(self, query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor, scale: float, window: int | None = None,
               softcap: float | None = None) -> torch.Tensor:
        """query [B, H, D] fp32 -> [B, H, D], reading kv_cache [2, NB, BS, KVH, D] in place.

        window: each decode sees only its last `window` positions; softcap: scores become
        softcap * tanh(score / softcap). The kernel takes 0 for either as none."""
        q = query.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        out = torch.empty_like(q)
        _, _, block_size, kv_heads, _ = kv_cache.shape
        head_dim = q.shape[2]
        fn = getattr(self.lib, f"paged_decode_attention_{_SUFFIX[kv_cache.dtype]}")
        fn(q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), tables.data_ptr(),
           lens.data_ptr(), out.data_ptr(), q.shape[0], q.shape[1], head_dim, block_size, kv_heads,
           tables.shape[1], scale, window or 0, softcap or 0.0, torch.get_num_threads())
        return out

    def can_rope_write(self, qkv: torch.Tensor, kv_cache: torch.Tensor, positions: torch.Tensor,
                       cos: torch.Tensor) -> bool:
        """Whether rope_write_kv applies: CPU, fp32 activations, int64 inputs, a small KV row."""
        kv_heads, head_dim = kv_cache.shape[3], cache_head_dim(kv_cache)
        return (self.supports(qkv.dtype, kv_cache.dtype, qkv.device) and kv_cache.is_contiguous()
                and positions.dtype == torch.int64 and cos.dtype == torch.float32
                and cos.is_contiguous() and kv_heads * head_dim <= MAX_KV_ROW)

    def rope_write_kv(self, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      num_heads: int) -> torch.Tensor:
        """qkv [T, (H + 2 KVH) D] fp32 -> rotated queries [T, H, D]; rotated keys and values
        are written to kv_cache [2, NB, BS, KVH, D] at slot_mapping [T] (-1: skipped)."""
        kv_heads, head_dim = kv_cache.shape[3], cache_head_dim(kv_cache)
        if qkv.stride(1) != 1:
            qkv = qkv.contiguous()
        n = qkv.shape[0]
        q_out = torch.empty((n, num_heads, head_dim), dtype=qkv.dtype)
        fn = getattr(self.lib, f"rope_write_kv_{_SUFFIX[kv_cache.dtype]}")
        fn(qkv.data_ptr(), qkv.stride(0), positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
           q_out.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), slot_mapping.data_ptr(),
           n, num_heads, kv_heads, head_dim, torch.get_num_threads())
        return q_out


def cache_head_dim(kv_cache: torch.Tensor) -> int:
    """The head size of a cache [2, NB, BS, KVH, W]: W less an int8 row's scale."""
    return kv_cache.shape[-1] - (SCALE_BYTES if kv_cache.dtype == torch.int8 else 0)
