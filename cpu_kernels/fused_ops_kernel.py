"""Fused element-wise ops of a decoder step (src/fused_ops.cpp), bound to torch tensors:
residual-add + RMSNorm, SiLU-and-mul and GELU(tanh)-and-mul, one pass over the rows each.

Built from the avx2 level up. The torch versions with the same semantics, and the choice
between them, are engine/model/fused_ops.py's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class FusedOpsKernel:
    """add_rms_norm on contiguous fp32 CPU tensors; silu_and_mul and gelu_tanh_and_mul on fp32
    or bf16 ones (a bf16 GEMM's output, computed in fp32 and rounded back as torch rounds)."""

    SYMBOLS = ("add_rmsnorm_f32", "silu_and_mul_f32", "gelu_tanh_and_mul_f32", "silu_and_mul_bf16",
               "gelu_tanh_and_mul_bf16", "qk_rmsnorm_f32")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.add_rmsnorm_f32.restype = None
        lib.add_rmsnorm_f32.argtypes = [_P] * 4 + [_I64, _I64, ctypes.c_float, _INT, _INT]
        lib.qk_rmsnorm_f32.restype = None
        lib.qk_rmsnorm_f32.argtypes = [_P] + [_I64] * 6 + [_P, _P, ctypes.c_float, _INT]
        for name in ("silu_and_mul_f32", "gelu_tanh_and_mul_f32", "silu_and_mul_bf16", "gelu_tanh_and_mul_bf16"):
            getattr(lib, name).restype = None
            getattr(lib, name).argtypes = [_P, _P, _I64, _I64, _INT]

    @staticmethod
    def applies(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous()

    @staticmethod
    def applies_gated(x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and x.is_contiguous()

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x), the residual updated in place; with residual
        None, (norm(x), a copy of x)."""
        n = x.shape[-1]
        rows = x.numel() // n
        res = torch.empty_like(x) if residual is None else residual
        out = torch.empty_like(x)
        self.lib.add_rmsnorm_f32(x.data_ptr(), res.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n,
                                 eps, int(residual is not None), torch.get_num_threads())
        return out, res

    def qk_rms_norm(self, qkv: torch.Tensor, q_width: int, k_width: int, q_weight: torch.Tensor,
                    k_weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm in place on each row's queries (the first q_width columns, in pieces of
        q_weight's size) and keys (the next k_width, pieces of k_weight's size); returns qkv."""
        rows = qkv.numel() // qkv.shape[-1]
        self.lib.qk_rmsnorm_f32(qkv.data_ptr(), rows, qkv.shape[-1], q_width, k_width, q_weight.numel(),
                                k_weight.numel(), q_weight.data_ptr(), k_weight.data_ptr(), eps,
                                torch.get_num_threads())
        return qkv

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2N] -> [T, N]: silu(gate) * up."""
        return self.gated(self.lib.silu_and_mul_bf16 if gate_up.dtype == torch.bfloat16
                          else self.lib.silu_and_mul_f32, gate_up)

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2N] -> [T, N]: gelu(gate, approximate="tanh") * up."""
        return self.gated(self.lib.gelu_tanh_and_mul_bf16 if gate_up.dtype == torch.bfloat16
                          else self.lib.gelu_tanh_and_mul_f32, gate_up)

    @staticmethod
    def gated(fn: Callable[..., None], gate_up: torch.Tensor) -> torch.Tensor:
        n = gate_up.shape[-1] // 2
        rows = gate_up.numel() // (2 * n)
        out = gate_up.new_empty((*gate_up.shape[:-1], n))
        fn(gate_up.data_ptr(), out.data_ptr(), rows, n, torch.get_num_threads())
        return out
