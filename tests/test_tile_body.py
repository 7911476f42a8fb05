"""The block kernel's tile body (cpu_kernels/src/block_gemm.cpp): steps of many tokens on the
block weights, multiplied on AMX tiles, under each ISA cap this CPU allows (below amx there
is no tile body, and asking for it runs the integer body).

Its reference is the float64 product on the dequantized weights (formats.dequantize, gguf-py's
for the K-quants). By default the tokens enter as two bf16 halves on exact integer weights:
the tile body must come closer to the exact product than the integer body (int16 tokens)
does, so a step gives the same tokens whichever body its size picks. With PAGODE_TILE_BF16=1,
past 8 tokens they enter as bf16, and from 17 the weights are dequantized to bf16 on the fly: the tile body
must then come at least as close as the big-step GEMM it stands in for
(bf16 weights times bf16 tokens).
"""

from __future__ import annotations

import pytest
import torch
from test_kquant_kernel import random_blocks
from test_quantization import block_kernel

from engine.quant import dispatch, formats
from engine.tuning import kernel_crossover, timing

# One tile, partial tiles, 1 to 7 token tiles, each side of 8 (bf16 tokens) and of 16
# (dequantized panels), an odd count of token tiles in a panel's pairs.
TOKENS = (1, 2, 5, 8, 9, 16, 17, 33, 40, 63, 64, 65, 100)
PAIRED_TOKENS = 8


def weight(kind: str, n: int, k: int) -> formats.BlockWeights:
    if kind in formats.K_QUANTS:
        return formats.from_gguf(random_blocks(kind, n, k, seed=n + k), kind)
    return formats.quantize(torch.randn(n, k) * 0.05, kind)  # type: ignore[arg-type]


def check(kind: str, n: int, k: int, bf16: bool) -> None:
    w = weight(kind, n, k)
    bias = torch.randn(n)
    dense = formats.dequantize(w).double()
    torch.manual_seed(n)
    for m in TOKENS:
        x = torch.randn(m, k)
        x[:, 3] *= 40  # an outlier channel, as real activations have
        got = block_kernel()(x, w, bias, tile_from=1).double()
        exact = x.double() @ dense.T + bias
        if m <= PAIRED_TOKENS or not bf16:
            torch.testing.assert_close(got, exact, rtol=1e-5, atol=2e-5 * exact.abs().max().item())
            integer = block_kernel()(x, w, bias, tile_from=0).double()
            assert (got - exact).norm() < (integer - exact).norm(), (kind, n, k, m)
        else:
            big_step = (x.bfloat16() @ dense.bfloat16().T).double() + bias
            assert (got - exact).norm() <= (big_step - exact).norm(), (kind, n, k, m)


@pytest.mark.parametrize("bf16", [False, True], ids=["exact", "bf16"])
def test_tile_body_matches_the_exact_product_on_every_format(isa_cap: str, bf16: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAGODE_TILE_BF16", "1" if bf16 else "0")
    if not block_kernel().has_tile_body():
        assert isa_cap != "amx"
        return
    for kind in formats.K_QUANTS:
        for n, k in ((37, 256), (301, 1536)):
            check(kind, n, k, bf16)
    for kind in ("q4_1", "q8_0"):
        for n, k in ((37, 32), (1003, 160), (257, 1536)):
            check(kind, n, k, bf16)


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

