"""bf16 GEMMs: a many-tokens path of the quantized layers for CPUs with bf16 matrix units.

torch sends a bf16 `F.linear` to oneDNN, which runs it on AMX tiles (or AVX512-BF16 dot
products) where the CPU has them, several times faster than fp32 BLAS at serving batch
sizes, while a CPU without them emulates bf16 at a fraction of fp32's speed
(docs/speed.md). Where the kernels are built for AMX, steps of up to `kernel_tokens` run
pagode's own AMX GEMM on the same weight instead (cpu_kernels/src/bf16_gemm.cpp): at tens of
tokens a step is a read of the weights, which it streams faster than oneDNN does on a plain
weight; how far it wins is raced at load (engine/tuning/bf16_crossover.py). The weight is the
dequantized block weight rounded to bf16; activations are rounded per call; the output comes
back in fp32. It holds the quality gate (tests/test_quantization.py) where fbgemm's int8 does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cpu_kernels.bf16_gemm_kernel import OUT_BF16, OUT_ROUNDED_FP32, Bf16GemmKernel
from engine import native
from engine.tuning import bf16_crossover, timing


class Bf16Gemm:
    """y = x @ w.T (+ bias) with w in bf16, computed in bf16, returned in fp32."""

    name = "bf16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.detach().to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        self.out_features, self.in_features = self.weight.shape
        self.nbytes = self.weight.numel() * 2
        self.kernel = native.bf16_gemm()
        # The kernel adds an fp32 bias: the bf16 one rounded back, so both paths add the same.
        self.bias_f32 = None if self.bias is None else self.bias.float()
        self.kernel_tokens = bf16_crossover.limit(self.weight, time_kernel_and_onednn)

    def kernel_for(self, x: torch.Tensor) -> Bf16GemmKernel | None:
        """The AMX kernel where this step is within its raced limit, else None (oneDNN)."""
        return self.kernel if x.shape[0] <= self.kernel_tokens else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The product rounded to bf16, in fp32: the bits the bf16 chain gives (bf16())."""
        kernel = self.kernel_for(x)
        if kernel is not None:
            return kernel(x, self.weight, self.bias_f32, OUT_ROUNDED_FP32)
        return self.bf16(x).float()

    def bf16(self, x: torch.Tensor) -> torch.Tensor:
        """The product left in bf16, for a caller whose next op takes bf16 (the MLP's chain)."""
        kernel = self.kernel_for(x)
        if kernel is not None:
            return kernel(x, self.weight, self.bias_f32, OUT_BF16)
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias)


def time_kernel_and_onednn(rows: torch.Tensor, m: int) -> tuple[float, float]:
    """Seconds of (the AMX kernel, oneDNN) on bf16 `rows` [N, K] at m fp32 tokens."""
    kernel = native.bf16_gemm()
    assert kernel is not None
    x = torch.randn(m, rows.shape[1])
    return (timing.best_time(lambda: kernel(x, rows), 3),
            timing.best_time(lambda: F.linear(x.to(torch.bfloat16), rows).float(), 3))
