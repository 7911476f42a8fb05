"""A Llama-family decoder's layers on bf16 products, for the packed pooling forward
(engine/pooling/packed_decoder.py): QKV and output projections on oneDNN's prepacked bf16
weights (bf16_linear.py), and the SwiGLU MLP in three GEMMs with SiLU fused into the gate's
and the gate's product into the up projection's, so no element-wise pass runs between them
(one gate-up GEMM followed by SiLU and the product as torch ops took 20 ms where these two
fused GEMMs take 15, on 4,096 tokens of a 512-wide, 1,536-deep MLP on one AMX core).
Modules are replaced in place, and handed back for swap_back: the load-time probe
(engine/pooling/precision.py) may find bf16 under the gate and restore the fp32 layers.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.llama import MLP, DecoderLayer, LlamaForCausalLM
from engine.pooling.bf16_linear import Bf16Linear, can_fuse
from engine.quant.apply import set_module
from engine.quant.dense_gemm import DenseGemm
from engine.quant.dense_linear import DenseLinear
from engine.quant.onednn_gemm import OnednnGemm

Swapped = list[tuple[str, nn.Module]]  # (module name, the module it replaced)


def available() -> bool:
    """The bf16 layers are oneDNN's packed GEMMs with SiLU fused: torch must have them."""
    return can_fuse("silu")


def swap_in(model: LlamaForCausalLM) -> Swapped:
    """Every layer's projections and MLP in bf16 (they take and return bf16); what was replaced."""
    swapped: Swapped = []
    for index, layer in enumerate(model.layers):
        assert isinstance(layer, DecoderLayer)
        for name in ("qkv_proj", "o_proj"):
            linear = Bf16Linear(*fp32_weight(getattr(layer.self_attn, name)))
            swapped.append(swap(model, f"layers.{index}.self_attn.{name}", linear))
        swapped.append(swap(model, f"layers.{index}.mlp", Bf16GatedMlp(layer.mlp)))
    return swapped


def swap_back(model: nn.Module, swapped: Swapped) -> None:
    for name, module in swapped:
        set_module(model, name, module)


def swap(model: nn.Module, name: str, module: nn.Module) -> tuple[str, nn.Module]:
    old = model.get_submodule(name)
    set_module(model, name, module)
    return name, old


class Bf16GatedMlp(nn.Module):
    """down(silu(x Wg + bg) * (x Wu + bu)) in bf16 GEMMs alone, [T, hidden] bf16 in and out."""

    def __init__(self, mlp: MLP) -> None:
        super().__init__()
        weight, bias = fp32_weight(mlp.gate_up_proj)
        (gate, up), (gate_bias, up_bias) = weight.chunk(2), (None, None) if bias is None else bias.chunk(2)
        self.gate = Bf16Linear(gate, gate_bias, "silu")
        self.up = Bf16Linear(up, up_bias)
        self.down = Bf16Linear(*fp32_weight(mlp.down_proj))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.up.times(x, self.gate(x)))


def fp32_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of an unquantized linear layer as loaded: an nn.Linear, or the
    DenseLinear that --quantization none swaps in where a fp32 GEMM race picked it (oneDNN's
    packed weight is read back unchanged: the reorder only moves the same floats)."""
    if isinstance(module, nn.Linear):
        return module.weight.detach(), None if module.bias is None else module.bias.detach()
    if isinstance(module, DenseLinear) and isinstance(module.gemm, DenseGemm):
        return module.gemm.weight, module.gemm.bias
    if isinstance(module, DenseLinear) and isinstance(module.gemm, OnednnGemm):
        return module.gemm.packed.to_dense(), module.gemm.bias
    raise TypeError(f"bf16 products take an fp32 linear layer, not {type(module).__name__}")
