"""fp32 BLAS on the dequantized weight: a many-tokens path of the quantized layers, the one
every CPU has (engine/tuning/gemm_choice.py races it against oneDNN's fp32 and bf16 where they exist).

fbgemm's dynamic int8 linear (engine/quant/int8_gemm.py) is faster, but it quantizes each
call's activations per tensor, and this model's activations have outlier channels: on the
quality text it loses 34% perplexity (int8) and 28% top-1 agreement, far outside the gate.
So this path runs fp32 BLAS on exactly the weights the blocks stand for. For a
GGUF the dequantized weight is the one already loaded (a tied lm_head shares the embedding's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DenseGemm:
    """y = x @ w.T (+ bias) with w in fp32."""

    name = "fp32"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, shared: bool = False) -> None:
        self.weight = weight.detach().float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features, self.in_features = self.weight.shape
        # A weight shared with another module (the tied embedding) costs nothing extra.
        self.nbytes = 0 if shared else self.weight.numel() * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
