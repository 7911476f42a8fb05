"""The AMX bf16 GEMM for steps of tens of tokens (src/bf16_gemm.cpp), bound to torch tensors.

It reads the bf16 weight exactly as torch keeps it [N, K], so one copy serves it and the
oneDNN GEMM that big steps run; which of the two takes a step of M tokens is measured at load
(engine/tuning/bf16_crossover.py). Built in the amx library only.
"""

from __future__ import annotations

import ctypes

import torch

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# What the output holds, as include/bf16_gemm.h numbers it.
OUT_FP32, OUT_BF16, OUT_ROUNDED_FP32 = 0, 1, 2


class Bf16GemmKernel:
    """bf16_gemm on contiguous CPU tensors."""

    SYMBOLS = ("bf16_gemm",)

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.bf16_gemm.restype = None
        lib.bf16_gemm.argtypes = [_P, _INT, _P, _P, _P, _INT, _I64, _I64, _I64, _INT]

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """Whether the kernel takes this weight: bf16 [N, K], contiguous, N % 16 == 0, K % 32 == 0."""
        n, k = weight.shape
        return weight.dtype == torch.bfloat16 and weight.is_contiguous() and n % 16 == 0 and k % 32 == 0

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 out: int = OUT_FP32) -> torch.Tensor:
        """x [M, K] fp32 or bf16 -> [M, N]: fp32 sums (OUT_FP32), bf16 (OUT_BF16), or the bf16
        values in fp32 (OUT_ROUNDED_FP32); `bias` fp32 [N] or None."""
        assert self.fits(weight) and x.dtype in (torch.float32, torch.bfloat16)
        assert bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())
        x = x.contiguous()
        m, k = x.shape
        n = weight.shape[0]
        if k != weight.shape[1]:
            raise ValueError(f"input has {k} features, the weight expects {weight.shape[1]}")
        y = torch.empty(m, n, dtype=torch.bfloat16 if out == OUT_BF16 else torch.float32)
        self.lib.bf16_gemm(x.data_ptr(), int(x.dtype == torch.bfloat16), weight.data_ptr(),
                           0 if bias is None else bias.data_ptr(), y.data_ptr(), out,
                           m, n, k, torch.get_num_threads())
        return y
