"""The low-rank deltas of one step's rows, each row on its own adapter (the Punica / S-LoRA
idea): the base projection runs once over the whole batch, reading its weights once; then
each row gets x·Aᵀ·Bᵀ·scale of its own adapter only. Base rows get nothing added.

Two ways to compute the same sums, picked per call by the number of rows:

- **Stacked** (steps that mix adapters, up to STACKED_MAX_ROWS rows): every loaded adapter's A of the
  projection in one matrix, one product for all rows, a mask that keeps each row's own
  adapter's columns, then one product per output range (q, k, v; gate, up) with the adapters'
  B side by side. A step costs the same few calls however many adapters it mixes: with small
  matrices and few rows, the calls, not the arithmetic, are what a per-adapter loop pays for.
- **Grouped** (one adapter in the step, or more rows: prefill chunks): the rows gathered per
  adapter and each group's product run on its own matrices only, since there the arithmetic
  the mask wastes (every row times every loaded adapter) outweighs the calls saved. A group
  runs two products whatever the shards: its adapter's A side by side, then its B placed in
  one matrix as wide as the projection (zero outside each shard's columns), so that its
  delta lands in one add over whole rows; a scatter into a column range of the output (its
  rows strided) costs several times the products themselves.

On the CPU, with fp32 activations and the C++ kernels built, a step takes neither torch form:
one call (cpu_kernels/src/lora_delta.cpp) orders the adapter rows by adapter and adds each
tile of rows' two small products on its own adapter's matrices, with no mask, gather or
scatter; it beat both forms from 32 rows of decodes to 1,024-row prefill chunks. The fused
decode step calls the same function, so a decode step with adapter rows keeps the one-call
step (engine/model/decode_step.py). The torch forms remain for other devices and dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cpu_kernels.lora_delta_kernel import MAX_RANK, LoraDeltaKernel, shard_table
from engine import native

BASE = -1  # the slot of a row that runs on the base weights only
STACKED_MAX_ROWS = 64  # a step's rows up to which the stacked form runs


@dataclass(frozen=True)
class LoraRows:
    """Which packed rows of a step use which adapter slot: the step's LoRA metadata, built
    by the runner beside the attention metadata."""

    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, row indices), one per adapter present
    num_rows: int
    slots: torch.Tensor  # [num_rows] each row's slot (BASE for base rows), for the stacked form's mask

    @staticmethod
    def from_slots(slots: np.ndarray, device: torch.device | None = None) -> LoraRows:
        """From one slot per packed row (BASE for base rows); the indices on the model's device."""
        groups = tuple((int(slot), torch.from_numpy(np.flatnonzero(slots == slot)).to(device))
                       for slot in np.unique(slots) if slot != BASE)
        return LoraRows(groups, len(slots), torch.from_numpy(slots.astype(np.int64)).to(device))

    @property
    def active(self) -> bool:
        return bool(self.groups)


@dataclass(frozen=True)
class Shard:
    """One adapter's matrices for one output range of a (possibly fused) projection: qkv_proj
    holds a shard each for q, k and v; B is kept pre-multiplied by the adapter's scale."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out_range, r], times scale
    start: int
    stop: int


@dataclass(frozen=True)
class Stacked:
    """Every loaded adapter's shards of one projection side by side, ordered by output range
    then slot, so that each range's columns are one contiguous block."""

    a: torch.Tensor  # [R, in]: all shards' A
    column_slots: torch.Tensor  # [R]: the slot each column belongs to
    ranges: tuple[tuple[int, int, int, int, torch.Tensor], ...]  # (start, stop, first col, end col, B [out, cols])

    @staticmethod
    def of(shards: dict[int, list[Shard]]) -> Stacked | None:
        placed = sorted(((s.start, s.stop, slot, s) for slot, group in shards.items() for s in group),
                        key=lambda item: item[:3])
        if not placed:
            return None
        a = torch.cat([s.a for *_, s in placed])
        column_slots = torch.cat([torch.full((s.a.shape[0],), slot, dtype=torch.int64, device=a.device)
                                  for _, _, slot, s in placed])
        ranges, col = [], 0
        for start, stop in sorted({(start, stop) for start, stop, _, _ in placed}):
            b = torch.cat([s.b for first, last, _, s in placed if (first, last) == (start, stop)], dim=1)
            ranges.append((start, stop, col, col + b.shape[1], b))
            col += b.shape[1]
        return Stacked(a, column_slots, tuple(ranges))


@dataclass(frozen=True)
class Grouped:
    """One adapter's shards of a projection as two products: A of every shard stacked
    [R, in], and Bt [R, out] holding each shard's B transposed in its own rows and columns."""

    a: torch.Tensor
    bt: torch.Tensor

    @staticmethod
    def of(shards: list[Shard], out_features: int) -> Grouped:
        a = torch.cat([s.a for s in shards])
        bt = a.new_zeros((a.shape[0], out_features))
        row = 0
        for s in shards:
            bt[row:row + s.a.shape[0], s.start:s.stop] = s.b.t()
            row += s.a.shape[0]
        return Grouped(a, bt)


@dataclass(frozen=True)
class KernelTable:
    """A projection's shards as the C++ kernel reads them (lora_delta_kernel.shard_table):
    the kernel, the table of addresses, and the A and Bt matrices it points into."""

    kernel: LoraDeltaKernel
    table: torch.Tensor
    kept: tuple[torch.Tensor, ...]

    @staticmethod
    def of(shards: dict[int, list[Shard]], dtype: torch.dtype) -> KernelTable | None:
        """The shards in `dtype` (fp32 or bf16); None where the kernel cannot take them: not
        on the CPU, a rank over its bound, or no kernels built here. The kernel is looked up
        here, once per adapter load, not at every projection of every step."""
        placed = [(slot, s) for slot, group in sorted(shards.items()) for s in group]
        kernel = native.lora_delta() if placed else None
        if kernel is None or not all(s.a.device.type == "cpu" and s.a.shape[0] <= MAX_RANK for _, s in placed):
            return None
        entries = [(slot, s.start, s.stop, s.a.to(dtype).contiguous(), s.b.t().to(dtype).contiguous())
                   for slot, s in placed]
        return KernelTable(kernel, shard_table(entries), tuple(t for *_, a, bt in entries for t in (a, bt)))


class LoraProjection:
    """The adapters' shards of one projection, by slot; adds a step's deltas to its output."""

    def __init__(self, out_features: int = 0, kernel_dtype: torch.dtype = torch.float32) -> None:
        self.out_features = out_features  # the projection's width, where it has one
        self.kernel_dtype = kernel_dtype  # what the C++ kernel reads the matrices as
        self.shards: dict[int, list[Shard]] = {}
        self._stacked: Stacked | None = None
        self._grouped: dict[int, Grouped] = {}
        self.kernel_table: KernelTable | None = None  # what the C++ kernel reads, where it can

    def attach(self, slot: int, shards: list[Shard]) -> None:
        self.shards[slot] = shards
        self._rebuild()

    def detach(self, slot: int) -> None:
        if self.shards.pop(slot, None) is not None:
            self._rebuild()

    def _rebuild(self) -> None:
        self._stacked = Stacked.of(self.shards)
        out_features = max([self.out_features, *(s.stop for group in self.shards.values() for s in group)])
        self._grouped = {slot: Grouped.of(group, out_features) for slot, group in self.shards.items() if group}
        self.kernel_table = KernelTable.of(self.shards, self.kernel_dtype)

    def add_deltas(self, x: torch.Tensor, y: torch.Tensor, rows: LoraRows) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y2 = y.reshape(-1, y.shape[-1])
        if self._stacked is None:
            return y
        if self._add_kernel(x2, y2, rows):
            return y
        if len(rows.groups) > 1 and rows.num_rows <= STACKED_MAX_ROWS:
            self._add_stacked(x2, y2, rows, self._stacked)
        else:
            self._add_grouped(x2, y2, rows)
        return y

    def _add_kernel(self, x2: torch.Tensor, y2: torch.Tensor, rows: LoraRows) -> bool:
        """The C++ kernel's deltas, where it takes these tensors; False where it does not."""
        table = self.kernel_table
        if table is None or not table.kernel.applies(x2, y2):
            return False
        table.kernel.add(table.table, x2, y2, rows.slots)
        return True

    @staticmethod
    def _add_stacked(x2: torch.Tensor, y2: torch.Tensor, rows: LoraRows, stacked: Stacked) -> None:
        h = x2.to(stacked.a.dtype) @ stacked.a.t()
        h.mul_(rows.slots.unsqueeze(1) == stacked.column_slots)  # each row keeps its own adapter's columns
        for start, stop, first, end, b in stacked.ranges:
            y2[:, start:stop].add_((h[:, first:end] @ b.t()).to(y2.dtype))

    def _add_grouped(self, x2: torch.Tensor, y2: torch.Tensor, rows: LoraRows) -> None:
        for slot, index in rows.groups:
            grouped = self._grouped.get(slot)
            if grouped is None:
                continue  # this adapter leaves the projection as it is
            whole = index.numel() == rows.num_rows
            xs = x2 if whole else x2.index_select(0, index)
            delta = ((xs.to(grouped.a.dtype) @ grouped.a.t()) @ grouped.bt).to(y2.dtype)
            width = delta.shape[1]  # the last shard's end: columns past it get nothing
            if whole:
                y2[:, :width].add_(delta)
            elif width == y2.shape[1]:
                y2.index_add_(0, index, delta)
            else:
                y2[:, :width].index_add_(0, index, delta)
