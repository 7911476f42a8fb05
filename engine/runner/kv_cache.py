"""Size and allocate the paged KV cache from a memory budget, in its own dtype.

The cache dtype is independent of the model's: on the CPU it defaults to fp16, which
halves the bytes a decode step streams and doubles the tokens a budget holds; the
attention kernels convert rows as they read and write them. fp16 passes the same
quality gate as int8 weights (tests/test_kv_cache_dtype.py).

The size of one token's K and V (2 x layers x kv_heads x head_dim x bytes per value) is
written here once; the planner (planner/memory.py) sizes its plans with it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.config import DTYPES, KV_CACHE_DTYPES
from engine.model.config import ModelConfig


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is fp16 on the CPU (converted on the fly by the C++ kernels), the model's dtype on CUDA."""
    if name == "auto":
        return torch.float16 if device.type == "cpu" else model_dtype
    return kv_cache_dtype(name)


def kv_cache_dtype(name: str) -> torch.dtype:
    """An explicit KV-cache dtype: fp32, fp16 or bf16 (what the kernels read and write)."""
    if name == "auto" or name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv cache dtype {name!r}; choose from {', '.join(KV_CACHE_DTYPES)}")
    return DTYPES[name]


def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per value."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * dtype.itemsize


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return block_size * bytes_per_token(cfg, dtype)


def num_blocks_for(memory_bytes: int, cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return memory_bytes // bytes_per_block(cfg, block_size, dtype)


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> list[torch.Tensor]:
    """One tensor per layer: [2, num_blocks, block_size, kv_heads, head_dim]."""
    shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    if device.type == "cpu":
        return [lazily_zeroed(shape, dtype) for _ in range(cfg.num_hidden_layers)]
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]


def lazily_zeroed(shape: tuple[int, ...], dtype: torch.dtype, alignment: int = 64) -> torch.Tensor:
    """Zeros from pages the OS hands over already zeroed (calloc's fresh mappings, through numpy),
    so a GiB of cache costs no memset at start: each page is touched first by the step that
    writes it. The start is aligned to a cache line, as torch's own allocator aligns."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = torch.from_numpy(np.zeros(nbytes + alignment, dtype=np.uint8))
    skip = -raw.data_ptr() % alignment
    return raw[skip:skip + nbytes].view(dtype).view(shape)


def touch_blocks(kv_caches: list[torch.Tensor], count: int) -> None:
    """Write the first `count` blocks of every layer's cache, before load-time timings read
    them: untouched pages of a lazily zeroed cache all map to one shared zero page, which
    would make attention look nearly free. Only for a cache no request has used yet."""
    with torch.inference_mode():
        for cache in kv_caches:
            cache[:, :min(count, cache.shape[1])].fill_(0.01)
