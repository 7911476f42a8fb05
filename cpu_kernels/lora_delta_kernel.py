"""The adapter rows' low-rank deltas (src/lora_delta.cpp), bound to torch tensors.

This is the library half: the call, and the layout of a projection's adapter table that
both this call and the fused decode step read. engine/lora/delta.py builds the tables from
the loaded adapters and decides when the call applies. Built from the avx2 level up.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
MAX_RANK = 256  # the C++ side's bound on a rank (a stack buffer per row)


ELEMENT_TYPES = {torch.float32: 0, torch.bfloat16: 1}  # the element types the kernel reads


def shard_table(shards: Sequence[tuple[int, int, int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One projection's table: [count, then per shard slot, first column, end column, rank,
    A's address, Bt's address, element type]. Each shard is (slot, first, end, A [rank, in],
    Bt [rank, end - first]), both fp32 or both bf16, contiguous on the CPU; the caller keeps
    them alive."""
    rows = [len(shards)]
    for slot, first, end, a, bt in shards:
        assert a.dtype == bt.dtype and a.dtype in ELEMENT_TYPES and a.is_contiguous() and bt.is_contiguous()
        assert a.shape[0] == bt.shape[0] <= MAX_RANK and bt.shape[1] == end - first
        rows += [slot, first, end, a.shape[0], a.data_ptr(), bt.data_ptr(), ELEMENT_TYPES[a.dtype]]
    return torch.tensor(rows, dtype=torch.int64)


class LoraDeltaKernel:
    """lora_add_f32 on contiguous fp32 CPU tensors."""

    SYMBOLS = ("lora_add_f32",)

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.lora_add_f32.restype = None
        lib.lora_add_f32.argtypes = [_P, _P, _P, _I64, _I64, _I64, _P, _INT]

    @staticmethod
    def applies(x: torch.Tensor, y: torch.Tensor) -> bool:
        return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in (x, y))

    def add(self, table: torch.Tensor, x: torch.Tensor, y: torch.Tensor, row_slots: torch.Tensor) -> None:
        """y [M, N] += each adapter row's delta, in place; x [M, K], row_slots int64 [M]
        (-1: a base row)."""
        m, k = x.shape
        self.lib.lora_add_f32(table.data_ptr(), x.data_ptr(), y.data_ptr(), m, k, y.shape[1],
                              row_slots.data_ptr(), torch.get_num_threads())
