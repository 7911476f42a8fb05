"""Fused element-wise ops of the decoder on the CPU: residual-add + RMSNorm, SiLU-and-mul.

One C++ pass (engine/model/csrc, built on first use) replaces several eager torch ops
and their temporaries per call. Elsewhere (CUDA, other dtypes, no compiler, or
PAGODE_CPU_KERNEL=0) the same functions run as torch ops with identical semantics.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import native

_SOURCE = Path(__file__).parent / "csrc" / "fused_ops_cpu.cpp"
_FLAGS = [*native.CPU_FLAGS, "-ffp-contract=off"]
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def _declare(lib: ctypes.CDLL) -> None:
    lib.add_rmsnorm_f32.restype = None
    lib.add_rmsnorm_f32.argtypes = [_P] * 4 + [_I64, _I64, ctypes.c_float, _INT, _INT]
    lib.silu_and_mul_f32.restype = None
    lib.silu_and_mul_f32.argtypes = [_P, _P, _I64, _I64, _INT]


KERNEL = native.Kernel(_SOURCE, _FLAGS, _declare, depends=(_SOURCE.parent / "simd_exp.h",))
load = KERNEL.load


def _native(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and load() is not None


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm arithmetic."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x); with residual None, (norm(x), x)."""
    if _native(x) and weight.dtype == torch.float32 and (residual is None or residual.is_contiguous()):
        lib = KERNEL.lib
        assert lib is not None
        n = x.shape[-1]
        rows = x.numel() // n
        res = torch.empty_like(x) if residual is None else residual
        out = torch.empty_like(x)
        lib.add_rmsnorm_f32(x.data_ptr(), res.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, n,
                            eps, int(residual is not None), torch.get_num_threads())
        return out, res
    res = x if residual is None else residual + x
    return rms_norm_reference(res, weight, eps), res


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2N] -> [T, N]: silu(gate) * up."""
    if _native(gate_up):
        lib = KERNEL.lib
        assert lib is not None
        n = gate_up.shape[-1] // 2
        rows = gate_up.numel() // (2 * n)
        out = gate_up.new_empty((*gate_up.shape[:-1], n))
        lib.silu_and_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, n, torch.get_num_threads())
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
