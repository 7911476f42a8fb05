"""A linear layer on oneDNN's prepacked bf16 weight, its activation fused into the GEMM.

A pooling model in bf16 (Encoder.use_bf16, PackedDecoder.use_bf16) spends its time in a few
GEMMs of thousands of tokens. oneDNN runs them on the CPU's bf16 matrix units from a weight
reordered once into its blocked layout, and applies GELU, ReLU or SiLU to each output tile
while it is in cache, or multiplies the tile by another tensor (a gated MLP's gate): as a
separate op, the element-wise step reads and writes the widest tensor of the layer again and
took as long as the GEMM itself. This is the pair of ops torch's inductor emits for a CPU
linear (`_reorder_linear_weight` at load, `_linear_pointwise` per call); the output stays bf16.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.quant.onednn_gemm import PACK_FOR_TOKENS
from engine.quant.onednn_gemm import available as onednn_available

# hidden_act -> oneDNN's post-op (attr, algorithm), as _linear_pointwise names them.
FUSED_ACTIVATIONS = {"none": ("none", ""), "gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                     "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", ""), "silu": ("swish", "")}


def can_fuse(activation: str) -> bool:
    return onednn_available() and activation in FUSED_ACTIVATIONS


class Bf16Linear(nn.Module):
    """y = act(x @ W^T + b) in bf16, for any leading shape of x (cast to bf16 if it is not)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none") -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        rounded = weight.detach().to(torch.bfloat16).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(rounded, PACK_FOR_TOKENS)
        self.bias = None if bias is None else bias.detach().to(torch.bfloat16).contiguous()
        self.attr, self.algorithm = FUSED_ACTIVATIONS[activation]

    @classmethod
    def of(cls, linear: nn.Linear, activation: str = "none") -> Bf16Linear:
        return cls(linear.weight, linear.bias, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = torch.ops.mkldnn._linear_pointwise(self._rows(x), self.packed, self.bias, self.attr, [], self.algorithm)
        return out.reshape(*lead, self.out_features)

    def times(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W^T + b) * other, the product taken on each output tile (no activation):
        a gated MLP's up projection times its activated gate, [T, out] bf16 both."""
        assert self.attr == "none", "a multiplied output takes no activation"
        lead = x.shape[:-1]
        out = torch.ops.mkldnn._linear_pointwise.binary(self._rows(x), other.reshape(-1, self.out_features),
                                                        self.packed, self.bias, "mul")
        return out.reshape(*lead, self.out_features)

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).reshape(-1, self.in_features).contiguous()

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bf16, fused={self.attr}"
