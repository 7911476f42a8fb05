"""pagode's AMX bf16 GEMM (cpu_kernels/src/bf16_gemm.cpp) gives the product of the bf16-rounded
tokens with the bf16 weight, summed in fp32, for any number of tokens and for weights whose
rows are not a multiple of its 32-row panels; its three outputs agree bit for bit with each
other; a bf16 layer runs it up to the size its load-time race found and oneDNN above, the
two answering alike; and where the library is built below AMX, or PAGODE_BF16_KERNEL=0, the
layer keeps oneDNN at every size."""

from __future__ import annotations

import pytest
import torch

from cpu_kernels.bf16_gemm_kernel import OUT_BF16, OUT_FP32, OUT_ROUNDED_FP32
from engine import native
from engine.quant.bf16_gemm import Bf16Gemm
from engine.tuning import bf16_crossover

needs_kernel = pytest.mark.skipif(native.bf16_gemm() is None, reason="the bf16 GEMM kernel is built for AMX only")


def product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """In fp64, from the bf16-rounded tokens and weight (the kernel's products are exact)."""
    y = x.to(torch.bfloat16).double() @ w.double().t()
    return y if bias is None else y + bias.double()


@needs_kernel
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 64), (15, 48, 96), (17, 4096, 256), (33, 80, 2048), (57, 48, 96),
                                           (130, 32, 160)])
@pytest.mark.parametrize("bf16_in", [False, True])
def test_the_kernel_sums_the_bf16_products_in_fp32(m: int, n: int, k: int, bf16_in: bool) -> None:
    g = torch.Generator().manual_seed(m * n + k)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    x = torch.randn(m, k, generator=g)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).float()
    kernel = native.bf16_gemm()
    assert kernel is not None
    xin = x.to(torch.bfloat16) if bf16_in else x
    for b in (None, bias):
        y = kernel(xin, w, b, OUT_FP32)
        exact = product(x, w, b)
        # fp32 sums of k products: within a few fp32 roundings of each partial sum's size
        scale = (x.to(torch.bfloat16).double().abs() @ w.double().abs().t()).max()
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert ((y.double() - exact).abs().max() / scale) < 1e-5
        rounded = kernel(xin, w, b, OUT_BF16)
        assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, y.to(torch.bfloat16))
        widened = kernel(xin, w, b, OUT_ROUNDED_FP32)
        assert widened.dtype == torch.float32 and torch.equal(widened, rounded.float())


@needs_kernel
def test_a_bf16_layer_runs_the_kernel_up_to_its_race_and_onednn_above(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_RACE_CACHE", "0")
    g = torch.Generator().manual_seed(0)
    gemm = Bf16Gemm(torch.randn(256, 512, generator=g), torch.randn(256, generator=g))
    assert gemm.kernel_tokens >= 16  # a read of the weights at 16 tokens: the kernel wins it everywhere seen
    calls: list[int] = []
    kernel = gemm.kernel
    assert kernel is not None
    monkeypatch.setattr(gemm, "kernel", lambda x, *a: calls.append(x.shape[0]) or kernel(x, *a))
    gemm.kernel_tokens = 16
    for m in (16, 17):
        x = torch.randn(m, 512, generator=g)
        y = gemm(x)
        exact = product(x, gemm.weight, gemm.bias.float()).float()
        assert torch.allclose(y, exact, rtol=2e-2, atol=2e-2)  # both round their answer to bf16
        assert torch.equal(gemm.bf16(x).float(), y)
    assert calls == [16, 16]  # 17 tokens went to oneDNN


def test_no_kernel_below_amx_or_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    weight = torch.randn(64, 64).to(torch.bfloat16)
    monkeypatch.setenv("PAGODE_CPU_ISA", "avx512")
    assert native.bf16_gemm() is None and bf16_crossover.limit(weight, lambda *_: (0.0, 1.0)) == 0
    monkeypatch.delenv("PAGODE_CPU_ISA")
    monkeypatch.setenv("PAGODE_BF16_KERNEL", "0")
    assert bf16_crossover.limit(weight, lambda *_: (0.0, 1.0)) == 0
    assert Bf16Gemm(weight.float()).kernel_tokens == 0
