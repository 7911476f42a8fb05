"""Size and allocate the paged KV cache from a memory budget, in its own dtype.

The cache dtype is independent of the model's: on the CPU it defaults to fp16, which
halves the bytes a decode step streams and doubles the tokens a budget holds; the
attention kernels convert rows as they read and write them. fp16 passes the same
quality gate as int8 weights (tests/test_kv_cache_dtype.py), and so does int8, which
stores each (token, KV head) row as int8 values and an fp32 scale (engine/attention/
kv_int8.py says why that layout): ~1.9x fp16's tokens in the same bytes.

The size of one token's K and V (2 x layers x kv_heads x row width x bytes per value) is
written here once; the planner (planner/memory.py) sizes its plans with it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from engine.attention.kv_int8 import row_width
from engine.config import DTYPES, KV_CACHE_DTYPES, KV_ONLY_DTYPES
from engine.model.config import ModelConfig


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """What 'auto' means, in this one place: fp16 on the CPU (converted on the fly by the C++
    kernels), the model's dtype on CUDA.

    int8 passes the same quality gate as fp16 and holds ~1.9x its tokens, but 'auto' picks
    it only once a measurement shows it faster: it spends a multiply per row and a
    quantization per write to stream half the bytes, which pays where attention is bound by
    memory (many decodes at long contexts) and may not at one stream. The measurement that
    would flip it: `make bench-attention` and a saturation run (out tok/s at overload) with
    --kv-cache-dtype int8 against fp16 on a quiet machine, int8 at least level on both.
    """
    if name == "auto":
        return torch.float16 if device.type == "cpu" else model_dtype
    return kv_cache_dtype(name)


def kv_cache_dtype(name: str) -> torch.dtype:
    """An explicit KV-cache dtype: fp32, fp16, bf16 or int8 (what the kernels read and write)."""
    if name == "auto" or name not in KV_CACHE_DTYPES:
        raise ValueError(f"unknown kv cache dtype {name!r}; choose from {', '.join(KV_CACHE_DTYPES)}")
    return KV_ONLY_DTYPES.get(name) or DTYPES[name]


def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x KV heads x row width x bytes per value; an int8 row's width
    counts its 4-byte scale."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * row_width(cfg.head_dim, dtype) * dtype.itemsize


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return block_size * bytes_per_token(cfg, dtype)


def num_blocks_for(memory_bytes: int, cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return memory_bytes // bytes_per_block(cfg, block_size, dtype)


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> list[torch.Tensor]:
    """One tensor per layer: [2, num_blocks, block_size, kv_heads, head_dim] (head_dim + 4 for
    int8, each row's scale after its values)."""
    shape = (2, num_blocks, block_size, cfg.num_key_value_heads, row_width(cfg.head_dim, dtype))
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
