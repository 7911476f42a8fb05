"""The block kernel on llama.cpp's K-quants (Q4_K, Q5_K, Q6_K), computed on the super-blocks
as a GGUF stores them, against gguf-py's dequantization, under each ISA cap.

Random bytes are valid K-quant blocks (every 6-bit scale and min, every sign of Q6_K's int8
scales, every high bit), once the fp16 super-block scales are set to sane values, so the
weights here reach every bit pattern the decoder reads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_quantization import block_kernel, quantized_activations

from engine.quant import formats

# (GGUF bytes per super-block, offsets of its fp16 d (and dmin), the byte range of its quants)
LAYOUT = {"q4_k": (144, (0, 2), (16, 144)), "q5_k": (176, (0, 2), (16, 176)), "q6_k": (210, (208,), (0, 0))}
SHAPES = [(37, 256), (301, 1536)]


def random_blocks(kind: str, n: int, k: int, seed: int) -> np.ndarray:
    size, scale_offsets, _ = LAYOUT[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // 256, size), dtype=np.uint8)
    for off in scale_offsets:
        scale = rng.uniform(0.0005, 0.004, (n, k // 256)).astype(np.float16)
        raw[..., off:off + 2] = scale.view(np.uint8).reshape(n, k // 256, 2)
    return raw.reshape(n, -1)


def minimum_part(kind: str, raw: np.ndarray) -> torch.Tensor:
    """What the weights are with every quant zero: Q4_K/Q5_K's -dmin * m per sub-block, 0 for Q6_K
    (the kernel takes that term against the activations' exact sum)."""
    size, _, (lo, hi) = LAYOUT[kind]
    if lo == hi:
        return torch.zeros(raw.shape[0], raw.shape[1] // size * 256, dtype=torch.float64)
    zeroed = raw.reshape(raw.shape[0], -1, size).copy()
    zeroed[..., lo:hi] = 0
    return formats.dequantize(formats.from_gguf(zeroed.reshape(raw.shape), kind)).double()


@pytest.mark.parametrize("kind", sorted(LAYOUT))
@pytest.mark.parametrize("shape", SHAPES)
def test_k_quant_kernel_matches_gguf_dequantize(kind: str, shape: tuple[int, int], isa_cap: str) -> None:
    n, k = shape
    raw = random_blocks(kind, n, k, seed=n)
    w = formats.from_gguf(raw, kind)
    assert w.kind == kind and w.qs.shape == (n, k // 256 * LAYOUT[kind][0]) and w.in_features == k
    dense = formats.dequantize(w).double()
    mins = minimum_part(kind, raw)
    bias = torch.randn(n)
    torch.manual_seed(k)
    for m in (*range(1, 10), 33):
        x = torch.randn(m, k)
        x[:, 5] *= 40  # an outlier channel, as real activations have
        got = block_kernel()(x, w, bias).double()
        exact = quantized_activations(x).double() @ (dense - mins).T + x.double() @ mins.T + bias
        torch.testing.assert_close(got, exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())
        fp32 = x.double() @ dense.T + bias
        assert (got - fp32).norm() / fp32.norm() < 0.005, (kind, shape, m)


def test_parts_of_different_formats_fill_their_own_columns(isa_cap: str) -> None:
    """A fused layer whose shards kept their own formats (Q4_K q, k; Q6_K v) equals the three apart."""
    k = 512
    shards = [formats.from_gguf(random_blocks(kind, n, k, seed=n), kind)
              for kind, n in (("q4_k", 64), ("q4_k", 32), ("q6_k", 32))]
    fused = formats.concat_rows(shards)
    assert isinstance(fused, formats.BlockParts) and fused.out_features == 128
    x, bias = torch.randn(5, k), torch.randn(128)
    apart = torch.cat([block_kernel()(x, s) for s in shards], dim=1) + bias
    torch.testing.assert_close(block_kernel()(x, fused, bias), apart)
    torch.testing.assert_close(formats.dequantize(fused), torch.cat([formats.dequantize(s) for s in shards]))


def test_q4_0_blocks_become_the_q4_1_they_equal() -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    w = np.random.default_rng(0).normal(0, 0.1, (8, 256)).astype(np.float32)
    raw = quantize(w, GGMLQuantizationType.Q4_0)
    blocks = formats.from_gguf(raw, "q4_0")
    assert blocks.kind == "q4_1"
    expected = torch.from_numpy(np.asarray(dequantize(raw, GGMLQuantizationType.Q4_0), dtype=np.float32))
    assert torch.equal(formats.dequantize(blocks), expected.reshape(8, 256))
