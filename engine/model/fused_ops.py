"""Fused element-wise ops of the decoder: residual-add + RMSNorm, SiLU-and-mul, GELU(tanh)-and-mul.

On the CPU one C++ pass (cpu_kernels/fused_ops_kernel.py) replaces several eager torch ops and
their temporaries per call. Elsewhere (CUDA, other dtypes, no compiler, or
PAGODE_CPU_KERNEL=0: the kernel is None) the same functions run as torch ops with
identical semantics. The modules that call them (engine/model/layers.py) hold the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cpu_kernels.fused_ops_kernel import FusedOpsKernel


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm arithmetic."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 kernel: FusedOpsKernel | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + x), residual + x); with residual None, (norm(x), x)."""
    if (kernel is not None and kernel.applies(x) and weight.dtype == torch.float32
            and (residual is None or residual.is_contiguous())):
        return kernel.add_rms_norm(x, residual, weight, eps)
    res = x if residual is None else residual + x
    return rms_norm_reference(res, weight, eps), res


def silu_and_mul(gate_up: torch.Tensor, kernel: FusedOpsKernel | None) -> torch.Tensor:
    """[T, 2N] -> [T, N]: silu(gate) * up."""
    if kernel is not None and kernel.applies(gate_up):
        return kernel.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor, kernel: FusedOpsKernel | None) -> torch.Tensor:
    """[T, 2N] -> [T, N]: gelu(gate, approximate="tanh") * up (Gemma's GeGLU)."""
    if kernel is not None and kernel.applies(gate_up):
        return kernel.gelu_tanh_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
