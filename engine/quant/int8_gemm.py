"""fbgemm's dynamic int8 linear behind one small interface: a many-tokens path for measuring
only (PAGODE_QUANT_GEMM=fbgemm), since it fails the quality gate (dense_gemm.py).

torch.ao's quantized tensor API (quantize_per_channel, quantized::linear_prepack,
quantized::linear_dynamic) says it is deprecated; nothing else in pagode touches it, so
swapping it for another int8 GEMM means rewriting this file alone. The weight is int8 per
output channel (symmetric); activations are quantized per call to uint8, by default with a
7-bit range (reduce_range, PAGODE_FBGEMM_REDUCE_RANGE), which keeps AVX2's 16-bit pair sums
from saturating.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from engine import envs


def available() -> bool:
    return "fbgemm" in torch.backends.quantized.supported_engines or "x86" in torch.backends.quantized.supported_engines


class Int8Gemm:
    """y = x @ w.T (+ bias) with w held as a prepacked per-channel int8 matrix."""

    name = "fbgemm"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().float().contiguous()
        scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        zeros = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(w, scales, zeros, 0, torch.qint8)
            bias_f = None if bias is None else bias.detach().float().contiguous()
            self.packed: Any = torch.ops.quantized.linear_prepack(qweight, bias_f)
        self.out_features, self.in_features = w.shape
        self.nbytes = w.numel() + 12 * w.shape[0]  # int8 values + scale, zero point, column offset

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x.contiguous(), self.packed,
                                                 envs.FBGEMM_REDUCE_RANGE.get())
