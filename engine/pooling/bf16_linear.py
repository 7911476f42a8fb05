"""A linear layer on oneDNN's prepacked bf16 weight, its activation fused into the GEMM.

An encoder in bf16 (Encoder.use_bf16) spends its time in a few GEMMs of thousands of tokens.
oneDNN runs them on the CPU's bf16 matrix units from a weight reordered once into its blocked
layout, and applies GELU or ReLU to each output tile while it is in cache: as a separate op,
the activation reads and writes the widest tensor of the layer again and took as long as the
GEMM itself. This is the pair of ops torch's inductor emits for a CPU linear
(`_reorder_linear_weight` at load, `_linear_pointwise` per call); the output stays bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.quant.onednn_gemm import PACK_FOR_TOKENS
from engine.quant.onednn_gemm import available as onednn_available

# hidden_act -> oneDNN's post-op (attr, algorithm), as _linear_pointwise names them.
FUSED_ACTIVATIONS = {"none": ("none", ""), "gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                     "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", "")}


def can_fuse(activation: str) -> bool:
    return onednn_available() and activation in FUSED_ACTIVATIONS


class Bf16Linear(nn.Module):
    """y = act(x @ W^T + b) in bf16, for any leading shape of x (cast to bf16 if it is not)."""

    def __init__(self, linear: nn.Linear, activation: str = "none") -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().to(torch.bfloat16).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_FOR_TOKENS)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16).contiguous()
        self.attr, self.algorithm = FUSED_ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.to(torch.bfloat16).reshape(-1, self.in_features).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, self.attr, [], self.algorithm)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bf16, fused={self.attr}"
