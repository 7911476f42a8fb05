"""The adapter rows' deltas: the C++ kernel (the layer-by-layer path's and the fused decode
step's) and the torch forms (stacked up to STACKED_MAX_ROWS rows, grouped beyond; what runs
without the kernels) give each row its own adapter's x . A^T . B^T, and nothing to base
rows, under each ISA cap."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import native
from engine.lora.delta import BASE, STACKED_MAX_ROWS, LoraProjection, LoraRows, Shard

pytestmark = pytest.mark.usefixtures("isa_cap")  # every kernel under each cap the machine allows

K = 72  # neither width a multiple of a vector: the kernel's tails run too
RANGES = ((0, 40), (40, 64), (64, 88))  # q, k, v of a fused projection
RANKS = {0: 8, 1: 16, 2: 4}  # slot -> rank; slot 2 targets k alone


def projection(seed: int, kernel_dtype: torch.dtype = torch.float32) -> LoraProjection:
    g = torch.Generator().manual_seed(seed)
    proj = LoraProjection(kernel_dtype=kernel_dtype)
    for slot, rank in RANKS.items():
        ranges = RANGES[1:2] if slot == 2 else RANGES
        proj.attach(slot, [Shard(torch.randn(rank, K, generator=g), torch.randn(stop - start, rank, generator=g) * 0.3,
                                 start, stop) for start, stop in ranges])
    return proj


def reference(proj: LoraProjection, x: torch.Tensor, y: torch.Tensor, slots: np.ndarray,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """In fp32, from the matrices as `dtype` holds them."""
    out = y.clone()
    for row, slot in enumerate(slots.tolist()):
        for shard in proj.shards.get(slot, []):
            a, b = shard.a.to(dtype).float(), shard.b.to(dtype).float()
            out[row, shard.start:shard.stop] += (x[row] @ a.t()) @ b.t()
    return out


@pytest.fixture(params=["kernel", "torch"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the C++ kernel, and on the torch forms (the kernels switched off)."""
    if request.param == "torch":
        monkeypatch.setenv("PAGODE_CPU_KERNEL", "0")
    return str(request.param)


@pytest.mark.parametrize("rows", [1, 7, STACKED_MAX_ROWS, STACKED_MAX_ROWS + 9])
def test_each_row_gets_its_own_adapters_delta(rows: int, path: str) -> None:
    proj = projection(rows)
    g = torch.Generator().manual_seed(100 + rows)
    x, y = torch.randn(rows, K, generator=g), torch.randn(rows, RANGES[-1][1], generator=g)
    slots = np.array([(BASE, 0, 1, 2)[i % 4] for i in range(rows)], dtype=np.int64)
    expected = reference(proj, x, y, slots)
    out = proj.add_deltas(x, y.clone(), LoraRows.from_slots(slots))
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)
    assert torch.equal(out[slots == BASE], y[slots == BASE])  # base rows untouched, bit for bit


def test_the_kernel_takes_the_decode_sized_steps() -> None:
    """Where the kernels are built, a projection holds the table the C++ call reads (what the
    fused decode step reads too), rebuilt when an adapter leaves."""
    if native.lora_delta() is None:
        pytest.skip("no C++ compiler")
    proj = projection(0)
    assert proj.kernel_table is not None
    assert int(proj.kernel_table.table[0]) == 3 + 3 + 1  # shards: slot 0's three, slot 1's three, slot 2's one
    proj.detach(1)
    assert proj.kernel_table is not None and int(proj.kernel_table.table[0]) == 4
    proj.detach(0)
    proj.detach(2)
    assert proj.kernel_table is None


@pytest.mark.parametrize("rows", [5, STACKED_MAX_ROWS + 9])
def test_an_adapter_on_part_of_a_fused_projection(rows: int, path: str) -> None:
    """An adapter on k alone adds to k's columns and leaves q's and v's as they were."""
    g = torch.Generator().manual_seed(7)
    proj = LoraProjection(out_features=RANGES[-1][1])
    (start, stop), rank = RANGES[1], 8
    a, b = torch.randn(rank, K, generator=g), torch.randn(stop - start, rank, generator=g)
    proj.attach(0, [Shard(a, b, start, stop)])
    x, y = torch.randn(rows, K, generator=g), torch.randn(rows, RANGES[-1][1], generator=g)
    slots = np.array([0 if i % 3 else BASE for i in range(rows)], dtype=np.int64)
    out = proj.add_deltas(x, y.clone(), LoraRows.from_slots(slots))
    torch.testing.assert_close(out, reference(proj, x, y, slots), atol=2e-5, rtol=2e-5)
    assert torch.equal(out[:, :start], y[:, :start]) and torch.equal(out[:, stop:], y[:, stop:])


def test_bf16_tables_read_the_rounded_matrices() -> None:
    """Beside block-quantized weights the kernel reads the adapters in bf16: each row's delta
    is the one of the bf16-rounded matrices, accumulated in fp32."""
    if native.lora_delta() is None:
        pytest.skip("no C++ compiler")
    proj, rows = projection(3, torch.bfloat16), 9
    g = torch.Generator().manual_seed(11)
    x, y = torch.randn(rows, K, generator=g), torch.randn(rows, RANGES[-1][1], generator=g)
    slots = np.array([(BASE, 0, 1, 2)[i % 4] for i in range(rows)], dtype=np.int64)
    out = proj.add_deltas(x, y.clone(), LoraRows.from_slots(slots))
    torch.testing.assert_close(out, reference(proj, x, y, slots, torch.bfloat16), atol=2e-5, rtol=2e-5)
    assert not torch.allclose(out, reference(proj, x, y, slots), atol=2e-5, rtol=2e-5)  # the rounding shows
