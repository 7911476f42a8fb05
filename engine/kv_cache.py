"""Size and allocate the paged KV cache from a memory budget, in its own dtype.

The cache dtype is independent of the model's: on the CPU it defaults to fp16, which
halves the bytes a decode step streams and doubles the tokens a budget holds; the
attention kernels convert rows as they read and write them. fp16 passes the same
quality gate as int8 weights (tests/test_kv_cache_dtype.py).
"""

from __future__ import annotations

import torch

from engine.model.config import ModelConfig

_KV_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is fp16 on the CPU (converted on the fly by the C++ kernels), the model's dtype on CUDA."""
    if name == "auto":
        return torch.float16 if device.type == "cpu" else model_dtype
    if name not in _KV_DTYPES:
        raise ValueError(f"unknown kv cache dtype {name!r}; choose from auto, {', '.join(_KV_DTYPES)}")
    return _KV_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in _KV_DTYPES.items()}.get(dtype, str(dtype).removeprefix("torch."))


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


def num_blocks_for(memory_bytes: int, cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return memory_bytes // bytes_per_block(cfg, block_size, dtype)


def allocate_kv_cache(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> list[torch.Tensor]:
    """One tensor per layer: [2, num_blocks, block_size, kv_heads, head_dim]."""
    shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
