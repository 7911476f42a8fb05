"""fp32 on oneDNN with a prepacked weight: exact fp32 arithmetic, a faster GEMM where BLAS is slow.

torch sends an fp32 `F.linear` to its BLAS (MKL), which on some CPUs runs a decoder
layer's projections much slower than oneDNN's own fp32 kernels on a weight reordered once
into oneDNN's blocked layout (docs/speed.md); the race at load (engine/tuning/gemm_choice.py) decides
per CPU and shape. This is the pair of ops that torch's inductor emits for a CPU linear: `_reorder_linear_weight`
at load, `_linear_pointwise` per call. The packed copy is opaque to everything else (the
block kernels keep their own weights), so it replaces the fp32 weight rather than joining
it. Results match fp32 BLAS to a few ulps (another order of summation); nothing is rounded.
"""

from __future__ import annotations

import torch

PACK_FOR_TOKENS = 64  # the batch size oneDNN is told to expect; other sizes run on the same pack


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class OnednnGemm:
    """y = x @ w.T (+ bias) in fp32 on a oneDNN-packed w."""

    name = "onednn"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        w = weight.detach().float().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_FOR_TOKENS)
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features, self.in_features = w.shape
        self.nbytes = w.numel() * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.float().contiguous(), self.packed, self.bias, "none", [], "")
