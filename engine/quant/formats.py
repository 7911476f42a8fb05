"""Block-quantized weight formats (llama.cpp's Q4_1 and Q8_0) as torch tensors.

A weight [N, K] is cut along K into blocks of 32 inputs, each with its own fp16 scale
(and, for Q4_1, an fp16 minimum): Q4_1 stores w = d * q + m with q in 0..15 as nibbles
(byte i holds element i low and element i + 16 high, as in GGUF); Q8_0 stores w = d * q
with q in -127..127. The quants and scales live in separate arrays so the kernel reads
them sequentially. GGUF tensors of these types convert without requantizing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

QK = 32
Kind = Literal["q4_1", "q8_0"]
# GGUF block sizes in bytes: Q4_1 = d, m (fp16) + 16 nibble bytes; Q8_0 = d (fp16) + 32 int8.
GGUF_BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}


@dataclass
class BlockWeights:
    kind: Kind
    qs: torch.Tensor  # q4_1: uint8 [N, K/2]; q8_0: int8 [N, K]
    scales: torch.Tensor  # fp16 [N, K/32]
    mins: torch.Tensor | None  # fp16 [N, K/32] for q4_1
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scales, self.mins) if t is not None)

    def rows(self, index: torch.Tensor) -> BlockWeights:
        """The same weight with its output rows reordered (blocks run along K, so they stay intact)."""
        mins = None if self.mins is None else self.mins[index].contiguous()
        return BlockWeights(self.kind, self.qs[index].contiguous(), self.scales[index].contiguous(), mins,
                            len(index), self.in_features)


def quantizable(in_features: int) -> bool:
    return in_features % QK == 0


def quantize(w: torch.Tensor, kind: Kind) -> BlockWeights:
    return quantize_q4_1(w) if kind == "q4_1" else quantize_q8_0(w)


def quantize_q8_0(w: torch.Tensor) -> BlockWeights:
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // QK, QK)
    d = blocks.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inv.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return BlockWeights("q8_0", q.reshape(n, k).contiguous(), d.half(), None, n, k)


def quantize_q4_1(w: torch.Tensor) -> BlockWeights:
    n, k = w.shape
    blocks = w.detach().float().reshape(n, k // QK, QK)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    d = (hi - lo) / 15.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.floor((blocks - lo.unsqueeze(-1)) * inv.unsqueeze(-1) + 0.5).clamp(0, 15).to(torch.uint8)
    packed = q[..., : QK // 2] | (q[..., QK // 2:] << 4)
    return BlockWeights("q4_1", packed.reshape(n, k // 2).contiguous(), d.half(), lo.half(), n, k)


def dequantize(w: BlockWeights) -> torch.Tensor:
    """The fp32 weight [N, K] that the blocks stand for (the reference of the kernel)."""
    n, k = w.out_features, w.in_features
    d = w.scales.float().unsqueeze(-1)
    if w.kind == "q8_0":
        return (w.qs.reshape(n, k // QK, QK).float() * d).reshape(n, k)
    assert w.mins is not None
    packed = w.qs.reshape(n, k // QK, QK // 2)
    q = torch.cat((packed & 0x0F, packed >> 4), dim=-1).float()
    return (q * d + w.mins.float().unsqueeze(-1)).reshape(n, k)


def from_gguf(raw: np.ndarray, kind: Kind) -> BlockWeights:
    """A GGUF tensor's bytes [N, K/32 * block bytes] (uint8) as BlockWeights, without requantizing."""
    n = raw.shape[0]
    nb = raw.shape[1] // GGUF_BLOCK_BYTES[kind]
    blocks = np.ascontiguousarray(raw).reshape(n, nb, GGUF_BLOCK_BYTES[kind])
    scales = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).reshape(n, nb))
    if kind == "q8_0":
        qs = torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(n, nb * QK))
        return BlockWeights("q8_0", qs, scales, None, n, nb * QK)
    mins = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16).reshape(n, nb))
    qs = torch.from_numpy(blocks[..., 4:].copy().reshape(n, nb * QK // 2))
    return BlockWeights("q4_1", qs, scales, mins, n, nb * QK)


def concat_rows(parts: list[BlockWeights]) -> BlockWeights:
    """Fuse shards (q, k, v or gate, up) along the output dimension."""
    kinds = {p.kind for p in parts}
    assert len(kinds) == 1 and len({p.in_features for p in parts}) == 1
    mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts if p.mins is not None])
    return BlockWeights(parts[0].kind, torch.cat([p.qs for p in parts]), torch.cat([p.scales for p in parts]),
                        mins, sum(p.out_features for p in parts), parts[0].in_features)
