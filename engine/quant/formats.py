"""Block-quantized weight formats (llama.cpp's Q4_1, Q8_0 and K-quants) as torch tensors.

A weight [N, K] is cut along K into blocks of 32 inputs, each with its own fp16 scale
(and, for Q4_1, an fp16 minimum): Q4_1 stores w = d * q + m with q in 0..15 as nibbles
(byte i holds element i low and element i + 16 high, as in GGUF); Q8_0 stores w = d * q
with q in -127..127. The quants and scales live in separate arrays so the kernel reads
them sequentially. GGUF tensors of these types convert without requantizing, and so does
Q4_0 (w = d * (q - 8) is Q4_1 with m = -8d, exact in fp16).

The K-quants (Q4_K, Q5_K, Q6_K) stay as the file's 256-element super-blocks, scales
inside (cpu_kernels/src/quant_linear.cpp reads them as they are): `qs` holds a row's
super-blocks, `scales` is empty. pagode never writes them; they come from GGUF files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

QK = 32
QK_K = 256
Kind = Literal["q4_1", "q8_0", "q4_k", "q5_k", "q6_k"]
K_QUANTS = ("q4_k", "q5_k", "q6_k")
# GGUF block sizes in bytes: Q4_1 = d, m (fp16) + 16 nibble bytes; Q8_0 = d (fp16) + 32 int8;
# Q4_0 = d + 16 nibble bytes; the K-quants' super-blocks of 256 (ggml-common.h).
GGUF_BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34, "q4_k": 144, "q5_k": 176, "q6_k": 210}
# The GGUF types whose blocks the kernel computes on (Q4_0 as the Q4_1 it equals).
KERNEL_GGUF_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


@dataclass
class BlockWeights:
    kind: Kind
    qs: torch.Tensor  # q4_1: uint8 [N, K/2]; q8_0: int8 [N, K]
    scales: torch.Tensor  # fp16 [N, K/32]
    mins: torch.Tensor | None  # fp16 [N, K/32] for q4_1
    out_features: int
    in_features: int
    # Steps of at least this many tokens run the kernel's AMX tile body, 0 none: measured at
    # load per shape (engine/tuning/kernel_crossover.py), like the crossover to a dense GEMM.
    tile_from: int = 0
    # Whether the tile body's steps of more than 8 tokens take int8 tokens: set at load where
    # the layer keeps a dense GEMM for bigger steps (engine/quant/apply.py), so that the kernel
    # stands in for that GEMM's bf16 arithmetic at the sizes between; else exact on the blocks.
    int8_tokens: bool = False

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.scales, self.mins) if t is not None)

    @property
    def parts(self) -> tuple[BlockWeights, ...]:
        return (self,)

    def rows(self, index: torch.Tensor) -> BlockWeights:
        """The same weight with its output rows reordered (blocks run along K, so they stay intact)."""
        mins = None if self.mins is None else self.mins[index].contiguous()
        return BlockWeights(self.kind, self.qs[index].contiguous(), self.scales[index].contiguous(), mins,
                            len(index), self.in_features, self.tile_from, self.int8_tokens)


@dataclass
class BlockParts:
    """A fused layer (qkv, gate-up) whose shards keep different formats, as a Q4_K_M file's
    Q4_K q and k beside a Q6_K v: the kernel computes each part into its own output columns."""

    parts: tuple[BlockWeights, ...]
    kind: str = "mixed"

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


Blocks = BlockWeights | BlockParts


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


def dequantize(w: Blocks) -> torch.Tensor:
    """The fp32 weight [N, K] that the blocks stand for (the reference of the kernel)."""
    if isinstance(w, BlockParts):
        return torch.cat([dequantize(p) for p in w.parts])
    n, k = w.out_features, w.in_features
    if w.kind in K_QUANTS:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize

        values = gguf_dequantize(w.qs.numpy(), GGMLQuantizationType[w.kind.upper()])
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(n, k))
    d = w.scales.float().unsqueeze(-1)
    if w.kind == "q8_0":
        return (w.qs.reshape(n, k // QK, QK).float() * d).reshape(n, k)
    assert w.mins is not None
    packed = w.qs.reshape(n, k // QK, QK // 2)
    q = torch.cat((packed & 0x0F, packed >> 4), dim=-1).float()
    return (q * d + w.mins.float().unsqueeze(-1)).reshape(n, k)


def kernel_kind(gguf_type: str) -> str:
    """The format the kernel computes a GGUF type's blocks in (Q4_0 as the Q4_1 it equals)."""
    return "q4_1" if gguf_type == "q4_0" else gguf_type


def from_gguf(raw: np.ndarray, kind: str) -> BlockWeights:
    """A GGUF tensor's bytes [N, blocks * block bytes] (uint8) as BlockWeights, without requantizing.
    `kind` is the GGUF type in lower case (q4_0 becomes the q4_1 it equals)."""
    n = raw.shape[0]
    nb = raw.shape[1] // GGUF_BLOCK_BYTES[kind]
    if kind in K_QUANTS:
        qs = torch.from_numpy(np.ascontiguousarray(raw).copy())
        return BlockWeights(kind, qs, torch.empty(n, 0, dtype=torch.float16), None, n, nb * QK_K)  # type: ignore[arg-type]
    blocks = np.ascontiguousarray(raw).reshape(n, nb, GGUF_BLOCK_BYTES[kind])
    scales = torch.from_numpy(blocks[..., 0:2].copy().view(np.float16).reshape(n, nb))
    if kind == "q4_0":  # d * (q - 8) = d * q + m with m = -8d (a power of two: exact in fp16)
        qs = torch.from_numpy(blocks[..., 2:].copy().reshape(n, nb * QK // 2))
        return BlockWeights("q4_1", qs, scales, scales * -8, n, nb * QK)
    if kind == "q8_0":
        qs = torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(n, nb * QK))
        return BlockWeights("q8_0", qs, scales, None, n, nb * QK)
    mins = torch.from_numpy(blocks[..., 2:4].copy().view(np.float16).reshape(n, nb))
    qs = torch.from_numpy(blocks[..., 4:].copy().reshape(n, nb * QK // 2))
    return BlockWeights("q4_1", qs, scales, mins, n, nb * QK)


def concat_rows(parts: list[BlockWeights]) -> Blocks:
    """Fuse shards (q, k, v or gate, up) along the output dimension; shards of different
    formats stay apart as BlockParts."""
    assert len({p.in_features for p in parts}) == 1
    if len({p.kind for p in parts}) > 1:
        return BlockParts(tuple(parts))
    mins = None if parts[0].mins is None else torch.cat([p.mins for p in parts if p.mins is not None])
    return BlockWeights(parts[0].kind, torch.cat([p.qs for p in parts]), torch.cat([p.scales for p in parts]),
                        mins, sum(p.out_features for p in parts), parts[0].in_features)
