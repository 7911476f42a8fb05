"""The int8 KV cache's row format: each (token, KV head) row holds head_dim int8 values,
then their fp32 scale, in one tensor per layer [2, num_blocks, block_size, kv_heads, head_dim + 4].

Why a scale per token and head (symmetric: scale = max|x| / 127, x ~ value * scale):
tokens arrive one at a time, and a row quantized alone when it is written is never touched
again. A scale per block would have to be widened, and the block's earlier rows
requantized, each time a larger value arrived; a scale per head over all tokens could not
be known in advance. Keys have outlier channels that differ token to token, which a
per-row absmax follows. This is what most int8 KV caches on CPUs do.

Why fp32 and inside the row: the cache stays a single tensor per layer, so anything that
shares, reuses or copies blocks carries the scales with their values, with no second
tensor to keep in step; a kernel finds a row's scale right after its values; fp32 needs
no conversion and costs 4 bytes per row: 68 bytes per 64-value row against fp16's 128
(1.88x fp16's tokens at head_dim 64, 1.94x at 128).

The C++ kernels (cpu_kernels/include/kv_convert.h) and the Triton kernels
(cuda_kernels/) read and write the same bytes; quantize() here rounds exactly as they do
(x / scale, ties to even), so the torch and C++ cache writes agree to the bit.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # one fp32 scale after a row's values


def is_int8(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == torch.int8


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements per (token, KV head) row of a cache of this dtype: the values, plus the scale for int8."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def head_dim(kv_cache: torch.Tensor) -> int:
    """The attention head size a cache [2, NB, BS, KVH, width] holds."""
    width = kv_cache.shape[-1]
    return width - SCALE_BYTES if is_int8(kv_cache) else width


def quantize(x: torch.Tensor) -> torch.Tensor:
    """Rows [..., D] of any float dtype -> int8 rows [..., D + 4] with their scale."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    values = torch.where(scale > 0, x / scale, 0.0).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([values, scale.view(torch.int8)], dim=-1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """int8 rows [..., D + 4] -> [..., D] in dtype (values times their row's scale, in fp32)."""
    d = rows.shape[-1] - SCALE_BYTES
    scale = rows[..., d:].contiguous().view(torch.float32)
    return (rows[..., :d].float() * scale).to(dtype)


def widen(kv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows as the attention's dtype: dequantized for int8, converted otherwise."""
    return dequantize(kv, dtype) if kv.dtype == torch.int8 else kv.to(dtype)


def store(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows [..., D] as the cache stores them: quantized for int8, converted otherwise."""
    return quantize(rows) if dtype == torch.int8 else rows.to(dtype)
