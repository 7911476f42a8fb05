"""DenseLinear: nn.Linear for `--quantization none` on the CPU, on the faster fp32 GEMM.

An unquantized model keeps fp32 weights, but torch's BLAS is not always the fastest way
to multiply by them: oneDNN on a prepacked weight can be much faster
(engine/quant/onednn_gemm.py, docs/speed.md). At load each weight shape races fp32 BLAS
against fp32 oneDNN (gemms.py, FP32_ONLY: never bf16, which `none`
does not promise); a layer whose winner is oneDNN becomes a DenseLinear holding only the
packed copy, the others stay nn.Linear. The arithmetic stays fp32 either way.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.quant.apply import set_module
from engine.quant.gemms import FP32_ONLY, Gemm, choose_gemm


class DenseLinear(nn.Module):
    """y = x @ W^T (+ b) through one dense GEMM object."""

    def __init__(self, gemm: Gemm) -> None:
        super().__init__()
        self.gemm = gemm
        self.in_features, self.out_features = gemm.in_features, gemm.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        return self.gemm(x.reshape(-1, self.in_features)).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, gemm={self.gemm.name}"


def speed_up_fp32_linears(model: nn.Module) -> dict[str, str]:
    """Swap each fp32 CPU nn.Linear whose shape oneDNN wins for a DenseLinear; name -> GEMM."""
    picked: dict[str, str] = {}
    for name, linear in [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]:
        if linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu":
            continue
        gemm = choose_gemm(linear.weight, linear.bias, allowed=FP32_ONLY)
        picked[name] = gemm.name
        if gemm.name != "fp32":
            set_module(model, name, DenseLinear(gemm))
    return picked
