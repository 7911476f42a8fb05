"""The fused prefill/extend attention kernel (src/prefill_attention.cpp), bound to torch tensors.

Chunks of new tokens of several sequences, packed one after another, attend causally to
themselves and to every cached position before them, reading the paged cache
[2, NB, BS, KVH, D] in place through the block tables, for fp32, fp16, bf16 or int8 cache
elements (fp32 queries and output; an int8 row is D values then their fp32 scale, so its
cache is [2, NB, BS, KVH, D + 4], dequantized to fp32 as it is read). Tiles with an online
softmax; an AVX2 fp32 body, and in the avx512 build a 16-wide fp32 body (int8 takes it too)
and bf16 products on AVX512-BF16 dot products, in the amx build on the tile unit. A bf16
cache always takes the bf16 products; an fp32 or fp16 cache takes them when the call asks
(`bf16=True`: queries, K/V and probabilities rounded to bf16, every sum in fp32), and
otherwise keeps the fp32 body. Built from the avx2 level up; elsewhere the library has no
such symbols.
"""

from __future__ import annotations

import ctypes

import torch

from cpu_kernels.paged_attention import cache_head_dim

_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.int8: "i8"}
_ELEMENT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int8: 3}
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
BODIES = {0: None, 1: "avx2 fp32", 2: "avx512 fp32", 3: "avx512 bf16 dot products", 4: "amx bf16 tiles"}
BF16_BODIES = ("avx512 bf16 dot products", "amx bf16 tiles")


class PrefillAttentionKernel:
    """Causal attention of packed prefill/extend chunks over a paged cache."""

    SYMBOLS = (*(f"paged_prefill_attention_{suffix}" for suffix in _SUFFIX.values()), "prefill_attention_body")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        for suffix in _SUFFIX.values():
            fn = getattr(lib, f"paged_prefill_attention_{suffix}")
            fn.restype = None
            fn.argtypes = [_P] * 7 + [_I64] * 6 + [ctypes.c_float, _I64, ctypes.c_float, ctypes.c_int, ctypes.c_int]
        lib.prefill_attention_body.restype = ctypes.c_int
        lib.prefill_attention_body.argtypes = [_I64, ctypes.c_int, ctypes.c_int]

    def body(self, head_dim: int, cache_dtype: torch.dtype, bf16: bool = False) -> str | None:
        """Which body runs this head size and cache element here, with or without bf16 asked
        for (None: none does)."""
        if cache_dtype not in _ELEMENT:
            return None
        return BODIES[int(self.lib.prefill_attention_body(head_dim, _ELEMENT[cache_dtype], int(bf16)))]

    def has_bf16_products(self, head_dim: int, cache_dtype: torch.dtype) -> bool:
        """Whether asking for bf16 changes this shape's body here (a bf16 product body is built,
        the head size suits it, the cache is fp32 or fp16)."""
        return self.body(head_dim, cache_dtype, True) != self.body(head_dim, cache_dtype, False)

    def supports(self, query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
        """On the CPU, fp32 queries, an fp32/fp16/bf16/int8 contiguous cache of the queries' head
        size, a head size it has a body for."""
        head_dim = query.shape[-1]
        return (query.device.type == "cpu" and query.dtype == torch.float32 and kv_cache.is_contiguous()
                and cache_head_dim(kv_cache) == head_dim and self.body(head_dim, kv_cache.dtype) is not None)

    def prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                query_starts: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                window: int | None = None, softcap: float | None = None, bf16: bool = False) -> torch.Tensor:
        """query [T, H, D] fp32 -> [T, H, D]: sequence s owns rows query_starts[s]..query_starts[s+1]
        (query_starts [S + 1], from 0), at its last positions of seq_lens[s]; block_tables [S, MB].

        window: a query at p sees keys > p - window; softcap: scores become
        softcap * tanh(score / softcap). None: neither. bf16: an fp32 or fp16 cache may take
        the bf16 products (body(..., bf16=True) says which body that is here)."""
        q = query.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        starts = query_starts.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        out = torch.empty_like(q)
        _, _, block_size, kv_heads, _ = kv_cache.shape
        head_dim = q.shape[2]
        fn = getattr(self.lib, f"paged_prefill_attention_{_SUFFIX[kv_cache.dtype]}")
        fn(q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), tables.data_ptr(), starts.data_ptr(),
           lens.data_ptr(), out.data_ptr(), lens.shape[0], q.shape[1], head_dim, block_size, kv_heads,
           tables.shape[1], scale, window or 0, softcap or 0.0, int(bf16), torch.get_num_threads())
        return out
