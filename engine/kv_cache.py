"""Size and allocate the paged KV cache from a memory budget."""

from __future__ import annotations

import torch

from engine.model.config import ModelConfig


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
