"""The block-quantized linear kernel (src/quant_linear.cpp), bound to torch tensors.

It is present at every level: AVX2 bodies from the avx2 level up, a portable one below
(correct, slow: `--quantization auto` then picks none). The weights are any object with
the fields of engine.quant.formats.BlockWeights (the BlockWeightsLike protocol), so this
package needs nothing from the engine.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Protocol

import torch

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
# The formats the kernel computes on, as src/quant_linear.cpp numbers them (BlockKind).
KINDS = {"q4_1": 0, "q8_0": 1, "q4_k": 2, "q5_k": 3, "q6_k": 4}


class BlockWeightsLike(Protocol):
    """A weight [N, K] in Q4_1 (with mins) or Q8_0 blocks of 32 along K, scales in fp16, or in
    K-quant super-blocks of 256 (qs holds GGUF's bytes, scales is empty)."""

    @property
    def kind(self) -> str: ...
    @property
    def qs(self) -> torch.Tensor: ...
    @property
    def scales(self) -> torch.Tensor: ...
    @property
    def mins(self) -> torch.Tensor | None: ...
    @property
    def out_features(self) -> int: ...
    @property
    def in_features(self) -> int: ...
    @property
    def tile_from(self) -> int: ...
    @property
    def int8_tokens(self) -> bool: ...


class BlocksLike(Protocol):
    """One weight as the parts that make up its output rows (several when a fused layer's
    shards keep different formats)."""

    @property
    def parts(self) -> Sequence[BlockWeightsLike]: ...
    @property
    def out_features(self) -> int: ...
    @property
    def in_features(self) -> int: ...


def part_rows(w: BlocksLike, bias: torch.Tensor | None, tile_from: int | None = None,
              int8: bool | None = None) -> list[list[int]]:
    """Each part's kind, rows, qs, scales, mins and bias pointers (0 where absent), the fewest
    tokens its tile body runs (`tile_from`, else the part's own; 0: never), and whether the
    tile body's steps of more than 8 tokens take int8 tokens (`int8`, else the part's own)."""
    rows, n0 = [], 0
    for p in w.parts:
        b = 0 if bias is None else bias.data_ptr() + n0 * bias.element_size()
        rows.append([KINDS[p.kind], p.out_features, p.qs.data_ptr(), p.scales.data_ptr(),
                     0 if p.mins is None else p.mins.data_ptr(), b, p.tile_from if tile_from is None else tile_from,
                     int(p.int8_tokens if int8 is None else int8)])
        n0 += p.out_features
    return rows


def part_table(w: BlocksLike, bias: torch.Tensor | None) -> torch.Tensor:
    """part_rows as int64 [parts, 8], the layout that linear() in src/decode_step.cpp reads."""
    return torch.tensor(part_rows(w, bias), dtype=torch.int64)


class BlockLinear:
    """y = x @ W^T (+ bias) on a block-quantized W: the integer body for few tokens, the AMX
    tile body (where built) from the weight's `tile_from` tokens on."""

    SYMBOLS = ("linear_blocks", "quant_kernel_uses_avx2", "quant_kernel_tile_body", "quant_kernel_tile_bf16")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.linear_blocks.restype = None
        lib.linear_blocks.argtypes = [_I64] + [_P] * 6 + [_I64] * 6 + [ctypes.c_int]
        lib.quant_kernel_uses_avx2.restype = ctypes.c_int
        lib.quant_kernel_tile_body.restype = ctypes.c_int
        lib.quant_kernel_tile_bf16.restype = None
        lib.quant_kernel_tile_bf16.argtypes = [ctypes.c_int]

    def uses_avx2(self) -> bool:
        return bool(self.lib.quant_kernel_uses_avx2())

    def has_tile_body(self) -> bool:
        return bool(self.lib.quant_kernel_tile_body())

    def set_tile_bf16(self, on: bool) -> None:
        """Steps of more than 8 tokens on the tile body with bf16 tokens (and bf16 panels from
        64): faster, at the big-step GEMM's precision; off, the tile body is exact on the blocks."""
        self.lib.quant_kernel_tile_bf16(int(on))

    def __call__(self, x: torch.Tensor, w: BlocksLike, bias: torch.Tensor | None = None,
                 tile_from: int | None = None, int8: bool | None = None) -> torch.Tensor:
        """x [M, K] fp32 -> [M, N] fp32 on the block-quantized weight w [N, K]; `tile_from`
        overrides the weight's own switch to the tile body (1: always, 0: never), `int8` its
        own choice of int8 tokens past 8 tokens."""
        x = x.contiguous()
        m, k = x.shape
        if k != w.in_features:
            raise ValueError(f"input has {k} features, the weight expects {w.in_features}")
        n = w.out_features
        y = torch.empty(m, n, dtype=torch.float32)
        threads = torch.get_num_threads()
        n0 = 0
        for kind, rows, qs, scales, mins, b, tiles, int8_tokens in part_rows(w, bias, tile_from, int8):
            self.lib.linear_blocks(kind, x.data_ptr(), qs, scales, mins, b, y.data_ptr() + n0 * y.element_size(),
                                   m, rows, k, n, tiles, int8_tokens, threads)
            n0 += rows
        return y
