"""Rotate-half rotary embedding from precomputed cos/sin tables, in HF's arithmetic.

The default RoPE of every attention backend and of the model's RotaryEmbedding; the C++
cache write (cpu_kernels/src/paged_attention.cpp) computes the same products, unfused,
and matches it bit for bit.
"""

from __future__ import annotations

import torch


def apply_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k [T, KVH, D] rotated at positions [T]; cos, sin [max_positions, D/2]."""
    c = cos[positions].unsqueeze(1)  # [T, 1, D/2]
    s = sin[positions].unsqueeze(1)
    return _rotate(q, c, s), _rotate(k, c, s)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
