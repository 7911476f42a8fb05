"""The block kernel's tile body (cpu_kernels/src/block_gemm.cpp): steps of many tokens on the
block weights, multiplied on AMX tiles, under each ISA cap this CPU allows (below amx there
is no tile body, and asking for it runs the integer body).

Its reference is the float64 product on the dequantized weights (formats.dequantize, gguf-py's
for the K-quants). By default the tokens enter as two bf16 halves on exact integer weights:
the tile body must come closer to the exact product than the integer body (int16 tokens)
does, so a step gives the same tokens whichever body its size picks. On a weight whose layer
keeps a dense GEMM for big steps (`int8_tokens`, PAGODE_TILE_INT8), past 8 tokens the tokens of
every format but Q8_0 are rounded to int8 in blocks of 32 and the weights' own integers
multiplied as bytes: the result must be the exact product of the weights with those rounded
tokens, to fp32 rounding. With PAGODE_TILE_BF16=1, past 8 tokens they enter
as bf16, and from 17 the weights are dequantized to bf16 on the fly: the tile body must then
come at least as close as the big-step GEMM it stands in for (bf16 weights times bf16 tokens).
"""

from __future__ import annotations

import pytest
import torch
from test_kquant_kernel import random_blocks
from test_quantization import block_kernel

from engine.quant import dispatch, formats
from engine.quant.apply import QuantReport, build_layer
from engine.quant.dense_gemm import DenseGemm
from engine.quant.linear import pinned_path
from engine.tuning import kernel_crossover, timing

# One tile, partial tiles, 1 to 7 token tiles, each side of 8 (bf16 tokens) and of 16
# (dequantized panels), an odd count of token tiles in a panel's pairs.
TOKENS = (1, 2, 5, 8, 9, 16, 17, 33, 40, 63, 64, 65, 100)
PAIRED_TOKENS = 8


def weight(kind: str, n: int, k: int) -> formats.BlockWeights:
    if kind in formats.K_QUANTS:
        return formats.from_gguf(random_blocks(kind, n, k, seed=n + k), kind)
    return formats.quantize(torch.randn(n, k) * 0.05, kind)  # type: ignore[arg-type]


def int8_tokens(x: torch.Tensor) -> torch.Tensor:
    """x rounded as the int8 tile body rounds it: per block of 32, to the nearest multiple of
    the block's largest magnitude / 127 (in fp32, ties to even), back in float64."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv).clamp(-128, 127)
    return (q.double() * (amax / 127.0).double()).reshape(x.shape)


def check(kind: str, n: int, k: int, mode: str) -> None:
    w = weight(kind, n, k)
    bias = torch.randn(n)
    dense = formats.dequantize(w).double()
    torch.manual_seed(n)
    for m in TOKENS:
        x = torch.randn(m, k)
        x[:, 3] *= 40  # an outlier channel, as real activations have
        got = block_kernel()(x, w, bias, tile_from=1, int8=mode == "int8").double()
        exact = x.double() @ dense.T + bias
        if m <= PAIRED_TOKENS or mode == "exact" or (mode == "int8" and kind == "q8_0"):
            torch.testing.assert_close(got, exact, rtol=1e-5, atol=2e-5 * exact.abs().max().item())
            integer = block_kernel()(x, w, bias, tile_from=0).double()
            assert (got - exact).norm() < (integer - exact).norm(), (kind, n, k, m)
        elif mode == "int8":
            rounded = int8_tokens(x) @ dense.T + bias
            torch.testing.assert_close(got, rounded, rtol=1e-5, atol=2e-5 * rounded.abs().max().item())
        else:
            big_step = (x.bfloat16() @ dense.bfloat16().T).double() + bias
            assert (got - exact).norm() <= (big_step - exact).norm(), (kind, n, k, m)


@pytest.mark.parametrize("mode", ["exact", "int8", "bf16"])
def test_tile_body_matches_the_exact_product_on_every_format(isa_cap: str, mode: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_TILE_BF16", "1" if mode == "bf16" else "0")
    if not block_kernel().has_tile_body():
        assert isa_cap != "amx"
        return
    for kind in formats.K_QUANTS:
        for n, k in ((37, 256), (301, 1536)):
            check(kind, n, k, mode)
    for kind in ("q4_1", "q8_0"):
        for n, k in ((37, 32), (1003, 160), (257, 1536)):
            check(kind, n, k, mode)


def test_below_amx_the_switch_is_ignored(isa_cap: str) -> None:
    """Builds below amx have no tile body: asking for it runs the integer body, bit for bit."""
    w = weight("q4_k", 48, 512)
    x = torch.randn(20, 512)
    if block_kernel().has_tile_body():
        assert not torch.equal(block_kernel()(x, w, tile_from=1), block_kernel()(x, w, tile_from=0))
    else:
        assert torch.equal(block_kernel()(x, w, tile_from=1), block_kernel()(x, w, tile_from=0))


def test_the_switch_splits_a_step_by_its_token_count(isa_cap: str) -> None:
    """With tile_from = 8, steps of 7 tokens run the integer body and steps of 8 the tile body,
    through the weight's own field as the fused decode step reads it (part tables)."""
    w = weight("q4_k", 40, 512)
    for m, body in ((7, 0), (8, 1)):
        x = torch.randn(m, 512)
        w.tile_from = 8
        switched = block_kernel()(x, w)
        assert torch.equal(switched, block_kernel()(x, w, tile_from=body))


def test_parts_of_different_formats_each_take_the_tile_body() -> None:
    k = 512
    shards = [weight(kind, n, k) for kind, n in (("q4_k", 64), ("q4_k", 32), ("q6_k", 32))]
    fused = formats.concat_rows(shards)
    x, bias = torch.randn(24, k), torch.randn(128)
    apart = torch.cat([block_kernel()(x, s, tile_from=1) for s in shards], dim=1) + bias
    torch.testing.assert_close(block_kernel()(x, fused, bias, tile_from=1), apart)


def test_the_switch_starts_past_the_integer_bodys_last_win() -> None:
    race = timing.Crossover(0, {1: (1.0, 2.0), 2: (1.0, 2.0), 4: (3.0, 2.0), 8: (3.0, 2.0)})
    race.decide()
    assert kernel_crossover.tile_switch(race) == 3
    never = timing.Crossover(0, {1: (3.0, 2.0), 2: (3.0, 2.0)})
    never.decide()
    assert kernel_crossover.tile_switch(never) == 1
    always = timing.Crossover(0, {1: (1.0, 2.0), 2: (1.0, 2.0)})
    always.decide()
    assert kernel_crossover.tile_switch(always) == 0


def test_a_measured_switch_is_set_on_every_part() -> None:
    k = 512
    fused = formats.concat_rows([weight("q4_k", 64, k), weight("q6_k", 32, k)])
    tile_from = dispatch.switch_to_tiles(fused)
    assert all(p.tile_from == tile_from for p in fused.parts)
    if not block_kernel().has_tile_body():
        assert tile_from == 0



@pytest.mark.parametrize(("crossover", "int8"), [(16, True), (4096, False)], ids=["gemm-kept", "kernel-only"])
def test_int8_tokens_only_where_the_layer_keeps_a_gemm(crossover: int, int8: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer whose crossover keeps the dense GEMM for big steps takes int8 tokens between;
    one whose kernel runs every step stays exact on its blocks."""
    monkeypatch.setenv("PAGODE_TILE_INT8", "1")
    monkeypatch.setenv("PAGODE_QUANT_CROSSOVER", str(crossover))
    monkeypatch.setenv("PAGODE_QUANT_TILES", "3")
    monkeypatch.setattr(kernel_crossover, "_cache", {})  # this process's pinned results stay here
    monkeypatch.setattr(kernel_crossover, "_tile_from", {})
    w = weight("q4_k", 64, 512)
    layer = build_layer(w, DenseGemm(formats.dequantize(w)), None, 512, QuantReport("int4"))
    has_tiles = block_kernel().has_tile_body()
    assert w.int8_tokens == (int8 and has_tiles)
    assert (layer.gemm is not None) == int8
    x = torch.randn(12, 512)
    exact = block_kernel()(x, w, tile_from=1, int8=False)
    got = layer(x)
    assert torch.equal(got, block_kernel()(x, w, tile_from=1, int8=w.int8_tokens))
    assert torch.equal(got, exact) != w.int8_tokens
    with pinned_path(layer, "kernel"):  # the quality gates' kernel path: exact blocks
        assert torch.equal(layer(x), exact)
