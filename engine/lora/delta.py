"""The low-rank deltas of one step's rows, each row on its own adapter (the Punica / S-LoRA
idea): the base projection runs once over the whole batch, reading its weights once; then
the rows are grouped by adapter and each group adds x·Aᵀ·Bᵀ·scale for its adapter only.
Base rows belong to no group and get nothing added."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BASE = -1  # the slot of a row that runs on the base weights only


@dataclass(frozen=True)
class LoraRows:
    """Which packed rows of a step use which adapter slot: the step's LoRA metadata, built
    by the runner beside the attention metadata."""

    groups: tuple[tuple[int, torch.Tensor], ...]  # (slot, row indices), one per adapter present
    num_rows: int

    @staticmethod
    def from_slots(slots: np.ndarray, device: torch.device | None = None) -> LoraRows:
        """From one slot per packed row (BASE for base rows); the indices on the model's device."""
        groups = tuple((int(slot), torch.from_numpy(np.flatnonzero(slots == slot)).to(device))
                       for slot in np.unique(slots) if slot != BASE)
        return LoraRows(groups, len(slots))

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


class LoraProjection:
    """The adapters' shards of one projection, by slot; adds a step's deltas to its output."""

    def __init__(self) -> None:
        self.shards: dict[int, list[Shard]] = {}

    def add_deltas(self, x: torch.Tensor, y: torch.Tensor, rows: LoraRows) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        y2 = y.reshape(-1, y.shape[-1])
        for slot, index in rows.groups:
            shards = self.shards.get(slot)
            if not shards:
                continue  # this adapter leaves the projection as it is
            whole = index.numel() == rows.num_rows
            xs = x2 if whole else x2.index_select(0, index)
            xs = xs.to(shards[0].a.dtype)
            for shard in shards:
                delta = (xs @ shard.a.t()) @ shard.b.t()
                target = y2[:, shard.start:shard.stop]
                if whole:
                    target.add_(delta.to(y2.dtype))
                else:
                    target.index_add_(0, index, delta.to(y2.dtype))
        return y
