"""The fused CPU ops of a decoder step agree with the torch ops they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.kernel_reference import reshape_and_cache_ref
from engine import native
from engine.model import fused_ops
from engine.model.layers import RMSNorm, RotaryEmbedding, SiluAndMul

pytestmark = pytest.mark.usefixtures("isa_cap")  # every kernel under each cap the machine allows
needs_kernels = pytest.mark.skipif(native.fused_ops() is None or native.paged_attention() is None,
                                   reason="no C++ compiler: the fused kernels are not built here")


@needs_kernels
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_add_rms_norm_matches_hf_arithmetic(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    x, residual = torch.randn(rows, 576, generator=g), torch.randn(rows, 576, generator=g) * 3
    weight = torch.rand(576, generator=g) + 0.5
    expected_res = residual + x
    expected = fused_ops.rms_norm_reference(expected_res, weight, 1e-5)
    kernel = native.fused_ops()
    out, res = fused_ops.add_rms_norm(x, residual.clone(), weight, 1e-5, kernel)
    torch.testing.assert_close(res, expected_res, atol=0, rtol=0)  # the add is exact
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    first, start = fused_ops.add_rms_norm(x, None, weight, 1e-5, kernel)  # the first layer: no residual yet
    torch.testing.assert_close(start, x, atol=0, rtol=0)
    torch.testing.assert_close(first, fused_ops.rms_norm_reference(x, weight, 1e-5), atol=1e-6, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize("rows,n", [(1, 1536), (33, 1536), (3, 13)])
def test_silu_and_mul_matches_torch(rows: int, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    gate_up = torch.randn(rows, 2 * n, generator=g) * 6
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])  # saturation and zero
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(fused_ops.silu_and_mul(gate_up, native.fused_ops()), F.silu(gate) * up,
                               atol=1e-6, rtol=2e-6)


@needs_kernels
@pytest.mark.parametrize("rows,n", [(1, 1536), (33, 1536), (3, 13)])
def test_gelu_tanh_and_mul_matches_torch(rows: int, n: int) -> None:
    g = torch.Generator().manual_seed(n)
    gate_up = torch.randn(rows, 2 * n, generator=g) * 6
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])  # saturation and zero
    gate, up = gate_up.chunk(2, dim=-1)
    # atol: for a very negative gate torch's tanh rounds to -1 and gives 0, where the kernel's
    # g / (1 + exp(-2u)) keeps the true tail, a few 1e-6 at most.
    torch.testing.assert_close(fused_ops.gelu_tanh_and_mul(gate_up, native.fused_ops()),
                               F.gelu(gate, approximate="tanh") * up, atol=5e-6, rtol=2e-6)


@needs_kernels
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("rows,n", [(1, 1536), (33, 1536), (3, 13)])
def test_gated_ops_on_bf16_rows_equal_fp32_then_torchs_rounding(op: str, rows: int, n: int) -> None:
    """A bf16 GEMM's output fed straight in gives, bit for bit, what casting it to fp32, the fp32
    op and torch's .to(bfloat16) give (NaN stays NaN): the MLP's bf16 chain changes no value."""
    g = torch.Generator().manual_seed(rows * n)
    gate_up = (torch.randn(rows, 2 * n, generator=g) * 6).to(torch.bfloat16)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -20.0])
    gate_up[-1, -3:] = torch.tensor([float("inf"), float("-inf"), 1e30])
    kernel, fn = native.fused_ops(), getattr(fused_ops, op)
    out = fn(gate_up, kernel)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
    expected = fn(gate_up.float(), kernel).to(torch.bfloat16)
    nan = expected.float().isnan()
    assert torch.equal(out.float().isnan(), nan)
    assert torch.equal(out.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])


@needs_kernels
@pytest.mark.parametrize("norm", ["head", "proj"])
@pytest.mark.parametrize("rows", [1, 40])
def test_qk_rms_norm_in_place_matches_hf_per_piece(norm: str, rows: int) -> None:
    """Qwen3's per-head and OLMo 2's whole-projection q/k norms, in place in the fused QKV
    output: each piece equals HF's RMSNorm on it, and the values are untouched."""
    heads, kv_heads, d = 16, 8, 128
    g = torch.Generator().manual_seed(rows)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g) * 3
    q_w = torch.rand(d if norm == "head" else heads * d, generator=g) + 0.5
    k_w = torch.rand(d if norm == "head" else kv_heads * d, generator=g) + 0.5
    before = qkv.clone()
    out = fused_ops.qk_rms_norm(qkv, heads * d, kv_heads * d, q_w, k_w, 1e-6, native.fused_ops())
    assert out.data_ptr() == qkv.data_ptr()  # in place
    q, k, v = before.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    expect_q = fused_ops.rms_norm_reference(q.reshape(-1, q_w.numel()), q_w, 1e-6).reshape(q.shape)
    expect_k = fused_ops.rms_norm_reference(k.reshape(-1, k_w.numel()), k_w, 1e-6).reshape(k.shape)
    torch.testing.assert_close(out[:, :heads * d], expect_q, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(out[:, heads * d:(heads + kv_heads) * d], expect_k, atol=2e-6, rtol=2e-6)
    assert torch.equal(out[:, (heads + kv_heads) * d:], v)
    fallback = fused_ops.qk_rms_norm(before.clone(), heads * d, kv_heads * d, q_w, k_w, 1e-6, None)
    torch.testing.assert_close(fallback, out, atol=2e-6, rtol=2e-6)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rope_and_cache_write_match_torch(dtype: torch.dtype) -> None:
    heads, kv_heads, d, bs, tokens = 9, 3, 64, 16, 21
    g = torch.Generator().manual_seed(5)
    rope = RotaryEmbedding(d, 512, 10000.0)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g)
    positions = torch.randint(0, 512, (tokens,), generator=g)
    slots = torch.randperm(8 * bs, generator=g)[:tokens]
    slots[3] = -1  # padding: not written
    cache = torch.zeros(2, 8, bs, kv_heads, d, dtype=dtype)
    kernel = native.paged_attention()
    assert kernel is not None
    q_out = kernel.rope_write_kv(qkv, positions, rope.cos, rope.sin, cache, slots, heads)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k = rope(positions, q.reshape(tokens, heads, d), k.reshape(tokens, kv_heads, d))
    expected = torch.zeros_like(cache)
    reshape_and_cache_ref(k, v.reshape(tokens, kv_heads, d), expected, slots)
    torch.testing.assert_close(q_out, q, atol=0, rtol=0)
    torch.testing.assert_close(cache.float(), expected.float(), atol=0, rtol=0)


def test_torch_fallbacks_keep_the_same_semantics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_CPU_KERNEL", "0")  # the modules built now hold no C++ kernel
    norm, act = RMSNorm(8, 1e-6), SiluAndMul()
    assert norm.kernel is None and act.kernel is None
    x, residual = torch.randn(3, 8), torch.randn(3, 8)
    norm.weight.data = torch.rand(8)
    out, res = norm(x, residual)
    torch.testing.assert_close(res, residual + x)
    torch.testing.assert_close(out, fused_ops.rms_norm_reference(residual + x, norm.weight, 1e-6))
    gate_up = torch.randn(3, 8)
    torch.testing.assert_close(act(gate_up), F.silu(gate_up[:, :4]) * gate_up[:, 4:])
    torch.testing.assert_close(fused_ops.gelu_tanh_and_mul(gate_up, None),
                               F.gelu(gate_up[:, :4], approximate="tanh") * gate_up[:, 4:])
