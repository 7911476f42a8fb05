"""A whole decode step of a block-quantized decoder in one C++ call (src/decode_step.cpp).

This is the library half: the call with raw pointers and the layout of the per-layer
pointer table. engine/model/decode_step.py fills the table from a model and decides
when the step applies. Built from the avx2 level up.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
CACHE_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int8: 3}
# Per layer, in this order: the RMSNorm weights before attention, after it, before the MLP and
# after it (0 where the layer has none), K cache, V cache, the q and k norms (0 where none),
# whether those span the whole projections (1) or each head (0), the RoPE cos and sin tables,
# the sliding window (0: none), the soft-cap as the bits of a float32 (0: none), the factor on
# each sublayer's output as float32 bits (0: none), the MLP's activation (ACTIVATIONS), then
# for each projection (PROJECTIONS order) a pointer to its part table (quant_linear.part_table),
# the number of parts, and a pointer to int64 [4] (0: none): its dense bf16 weight, the fp32
# bias the bf16 GEMM adds (0: none), and the step sizes from and to which it runs that GEMM
# (amx builds; src/decode_step.cpp's DenseSlot).
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


class DecodeStepKernel:
    """The C ABI of the fused step; the caller owns every tensor the pointers point into."""

    SYMBOLS = ("decode_step", "decode_step_slots")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.decode_step.restype = None
        args: list[Any] = [_P, _P, _I64, _P, _I64, _P, ctypes.c_float, ctypes.c_float]
        lib.decode_step.argtypes = args + [_P] * 4 + [_I64, _I64, _P, _P, ctypes.c_int]
        lib.decode_step_slots.restype = _I64

    def slots(self) -> int:
        """Pointers per layer in the table."""
        return int(self.lib.decode_step_slots())

    def run(self, hidden: torch.Tensor, table: torch.Tensor, dims: torch.Tensor, cache_type: int,
            final_norm: torch.Tensor, eps: float, scale: float, positions: torch.Tensor, slots: torch.Tensor,
            block_tables: torch.Tensor, seq_lens: torch.Tensor, lora: torch.Tensor | None = None,
            row_slots: torch.Tensor | None = None) -> None:
        """hidden [B, hidden] fp32: in, the token embeddings; out, the final RMSNorm of the last
        layer's residual stream. table int64 [L, slots()], dims int64 (hidden, heads, kv_heads,
        head_dim, intermediate, block_size); positions and slots int64 [B], block_tables int32
        [B, MB], seq_lens int32 [B], all contiguous. lora: int64 [L, 4] the addresses of each
        projection's adapter table (lora_delta_kernel.shard_table, 0 for none) with row_slots
        int64 [B] each row's adapter slot (-1: base), or None when no row runs on an adapter."""
        self.lib.decode_step(hidden.data_ptr(), table.data_ptr(), table.shape[0], dims.data_ptr(), cache_type,
                             final_norm.data_ptr(), eps, scale, positions.data_ptr(), slots.data_ptr(),
                             block_tables.data_ptr(), seq_lens.data_ptr(), hidden.shape[0], block_tables.shape[1],
                             None if lora is None else lora.data_ptr(),
                             None if row_slots is None else row_slots.data_ptr(), torch.get_num_threads())
