"""An MLP whose projections both run oneDNN's bf16 GEMM keeps its gate-up output in bf16
through the activation into the down projection, and gives the same bits as casting to fp32
around each op; a projection with a forward hook on its output (LoRA's deltas) stays fp32."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine import native
from engine.lora import LoraRegistry
from engine.model.layers import SiluAndMul
from engine.model.llama import runs_bf16
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.dense_gemm import DenseGemm
from engine.quant.linear import QuantLinear

needs_kernels = pytest.mark.skipif(native.fused_ops() is None, reason="no C++ compiler: no fused kernels")


def gemm_layer(out_features: int, in_features: int, seed: int, gemm: type = Bf16Gemm) -> QuantLinear:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=g) / in_features**0.5
    return QuantLinear(None, gemm(weight), None, max_kernel_tokens=0)


@needs_kernels
@pytest.mark.parametrize("tokens", [1, 37])
def test_bf16_chain_gives_the_cast_paths_bits(tokens: int) -> None:
    gate_up, down, act = gemm_layer(2 * 96, 64, 1), gemm_layer(64, 96, 2), SiluAndMul()
    x = torch.randn(tokens, 64, generator=torch.Generator().manual_seed(tokens))
    assert runs_bf16(gate_up, down, act.kernel, tokens)
    h = gate_up(x.to(torch.bfloat16))
    assert h.dtype == torch.bfloat16  # no cast after the GEMM
    chained = down(act(h))
    assert chained.dtype == torch.bfloat16
    cast = down(act(gate_up(x)))  # fp32 in: each layer casts in and out
    assert cast.dtype == torch.float32
    assert torch.equal(chained.float(), cast)


def test_no_chain_where_a_projection_is_not_bf16_or_is_hooked() -> None:
    kernel = native.fused_ops() or object()
    assert not runs_bf16(gemm_layer(192, 64, 1, DenseGemm), gemm_layer(64, 96, 2), kernel, 8)
    assert not runs_bf16(nn.Linear(64, 192), gemm_layer(64, 96, 2), kernel, 8)
    assert not runs_bf16(gemm_layer(192, 64, 1), gemm_layer(64, 96, 2), None, 8)  # no bf16 activation
    hooked = gemm_layer(192, 64, 1)
    hooked.bf16_io = False  # what the LoRA registry sets beside its hook
    assert not runs_bf16(hooked, gemm_layer(64, 96, 2), kernel, 8)
    assert hooked(torch.randn(3, 64).to(torch.bfloat16)).dtype == torch.float32


def test_lora_registry_keeps_its_projections_fp32() -> None:
    mlp = nn.Module()
    mlp.gate_up_proj, mlp.down_proj = gemm_layer(192, 64, 1), gemm_layer(64, 96, 2)
    LoraRegistry(mlp, max_loras=2, max_lora_rank=8)
    assert not mlp.gate_up_proj.bf16_io and not mlp.down_proj.bf16_io
    assert not runs_bf16(mlp.gate_up_proj, mlp.down_proj, native.fused_ops() or object(), 8)
