"""The block-quantized linear kernel (src/quant_linear.cpp), bound to torch tensors.

It is present at every level: AVX2 bodies from the avx2 level up, a portable one below
(correct, slow: `--quantization auto` then picks none). The weights are any object with
the fields of engine.quant.formats.BlockWeights (the BlockWeightsLike protocol), so this
package needs nothing from the engine.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch

_P = ctypes.c_void_p
_I64 = ctypes.c_int64


class BlockWeightsLike(Protocol):
    """A weight [N, K] in Q4_1 (with mins) or Q8_0 blocks of 32 along K, scales in fp16."""

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


class BlockLinear:
    """y = x @ W^T (+ bias) on a block-quantized W, for few tokens per call."""

    SYMBOLS = ("linear_q4_1", "linear_q8_0", "quant_kernel_uses_avx2")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.linear_q4_1.restype = None
        lib.linear_q4_1.argtypes = [_P] * 6 + [_I64] * 3 + [ctypes.c_int]
        lib.linear_q8_0.restype = None
        lib.linear_q8_0.argtypes = [_P] * 5 + [_I64] * 3 + [ctypes.c_int]
        lib.quant_kernel_uses_avx2.restype = ctypes.c_int

    def uses_avx2(self) -> bool:
        return bool(self.lib.quant_kernel_uses_avx2())

    def __call__(self, x: torch.Tensor, w: BlockWeightsLike,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] fp32 -> [M, N] fp32 on the block-quantized weight w [N, K]."""
        x = x.contiguous()
        m, k = x.shape
        if k != w.in_features:
            raise ValueError(f"input has {k} features, the weight expects {w.in_features}")
        y = torch.empty(m, w.out_features, dtype=torch.float32)
        b = 0 if bias is None else bias.data_ptr()
        threads = torch.get_num_threads()
        if w.kind == "q4_1":
            assert w.mins is not None
            self.lib.linear_q4_1(x.data_ptr(), w.qs.data_ptr(), w.scales.data_ptr(), w.mins.data_ptr(), b,
                                 y.data_ptr(), m, w.out_features, k, threads)
        else:
            self.lib.linear_q8_0(x.data_ptr(), w.qs.data_ptr(), w.scales.data_ptr(), b, y.data_ptr(),
                                 m, w.out_features, k, threads)
        return y
