"""bf16 on oneDNN: a many-tokens path of the quantized layers for CPUs with bf16 matrix
units. torch sends a bf16 `F.linear` to oneDNN, which runs it on AMX tiles (or AVX512-BF16
dot products) where the CPU has them, several times faster than fp32 BLAS at serving batch
sizes, while a CPU without them emulates bf16 at a fraction of fp32's speed
(docs/speed.md). The weight is the dequantized block weight rounded to bf16;
activations are rounded per call; the output comes back in fp32. It holds the quality gate
(tests/test_quantization.py) where fbgemm's int8 does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Bf16Gemm:
    """y = x @ w.T (+ bias) with w in bf16, computed in bf16, returned in fp32."""

    name = "bf16"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.detach().to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        self.out_features, self.in_features = self.weight.shape
        self.nbytes = self.weight.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.bf16(x).float()

    def bf16(self, x: torch.Tensor) -> torch.Tensor:
        """The product left in bf16, for a caller whose next op takes bf16 (the MLP's chain)."""
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias)
