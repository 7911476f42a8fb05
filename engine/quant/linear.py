"""QuantLinear: a drop-in for nn.Linear that computes on quantized weights.

It holds the copies its kernels need, and no others: the block-quantized weight for the
C++ block kernel (few tokens; cpu_kernels/quant_linear.py) and/or a dense weight for big
steps (fp32 for BLAS or oneDNN, or bf16 for oneDNN: engine/quant/gemms.py). Each call picks by
its number of tokens against the layer's measured crossover, unless `pinned_path` holds every
layer on one path (the quality gates read each path on its own). A bf16 input on the bf16
GEMM's path gives a bf16 output (bf16_path): a caller whose ops around the layer take bf16
skips the two casts; every other input is computed in fp32 and gives fp32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch
from torch import nn

from engine import native
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.formats import Blocks
from engine.quant.gemms import Gemm

Path = Literal["kernel", "gemm"]


class QuantLinear(nn.Module):
    def __init__(self, blocks: Blocks | None, gemm: Gemm | None,
                 bias: torch.Tensor | None, max_kernel_tokens: int) -> None:
        super().__init__()
        if blocks is None and gemm is None:
            raise ValueError("a QuantLinear needs the block weights, a dense GEMM, or both")
        self.blocks = blocks
        self.gemm = gemm
        ref = blocks if blocks is not None else gemm
        assert ref is not None
        self.in_features, self.out_features = ref.in_features, ref.out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)
        self.max_kernel_tokens = max_kernel_tokens if blocks is not None else 0
        self.kernel = native.block_linear() if blocks is not None else None
        self.pinned: Path | None = None  # pinned_path's override of the crossover
        self.bf16_io = True  # False: always fp32 out (a forward hook, as LoRA's, adds to the output)

    def path_for(self, tokens: int) -> Path:
        if self.pinned is not None:
            return self.pinned
        return "kernel" if tokens <= self.max_kernel_tokens or self.gemm is None else "gemm"

    def bf16_path(self, tokens: int) -> bool:
        """Whether a call of `tokens` rows runs the bf16 GEMM and, given bf16, answers in bf16."""
        return self.bf16_io and isinstance(self.gemm, Bf16Gemm) and self.path_for(tokens) == "gemm"

    def amx_gemm_steps(self) -> tuple[int, int] | None:
        """The step sizes (first, last) at which this layer, on its crossover, runs pagode's AMX
        bf16 GEMM on its dense copy (past the block kernel, within the GEMM's raced limit), or
        None where it never does. The fused decode step runs the same kernel at those sizes."""
        gemm = self.gemm
        if not isinstance(gemm, Bf16Gemm) or gemm.kernel_tokens <= self.max_kernel_tokens:
            return None
        return self.max_kernel_tokens + 1, gemm.kernel_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype == torch.bfloat16 and self.bf16_path(x2.shape[0]):
            assert isinstance(self.gemm, Bf16Gemm)
            return self.gemm.bf16(x2).reshape(*lead, self.out_features)
        x2 = x2.float()
        if self.path_for(x2.shape[0]) == "kernel":
            if self.blocks is None:
                raise RuntimeError("this layer keeps no block weights (its crossover never picks the kernel)")
            if self.kernel is None:
                raise RuntimeError("the block-quantized kernel is not available here")
            # A layer pinned on the kernel reads the exact blocks (the quality gates measure that
            # path); on its crossover, int8 tokens stand in for the GEMM where the weight says so.
            y = self.kernel(x2, self.blocks, self.bias, int8=False if self.pinned == "kernel" else None)
        else:
            if self.gemm is None:
                raise RuntimeError("this layer keeps no dense weights (its crossover never picks it)")
            y = self.gemm(x2)
        return y.reshape(*lead, self.out_features)

    @property
    def nbytes(self) -> int:
        total = 0 if self.blocks is None else self.blocks.nbytes
        return total + (0 if self.gemm is None else self.gemm.nbytes)

    def extra_repr(self) -> str:
        kind = None if self.blocks is None else self.blocks.kind
        return (f"in={self.in_features}, out={self.out_features}, blocks={kind}, "
                f"gemm={self.gemm is not None}, kernel_up_to={self.max_kernel_tokens}")


@contextlib.contextmanager
def pinned_path(model: nn.Module, path: Path | None) -> Iterator[None]:
    """Every QuantLinear of `model` on `path` inside the block; None leaves each on its crossover.

    A model's crossovers mix both paths by step size, so a measure of one path's quality (the
    quantization tests, `python -m benchmarks.quant_quality`) needs every call held on it.
    """
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    if path is not None:
        for layer in layers:
            if (layer.blocks if path == "kernel" else layer.gemm) is None:
                raise ValueError(f"a layer keeps no weights for the {path} path: {layer.extra_repr()}")
    try:
        for layer in layers:
            layer.pinned = path
        yield
    finally:
        for layer in layers:
            layer.pinned = None
