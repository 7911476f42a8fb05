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


def qk_rms_norm(qkv: torch.Tensor, q_width: int, k_width: int, q_weight: torch.Tensor, k_weight: torch.Tensor,
                eps: float, kernel: FusedOpsKernel | None) -> torch.Tensor:
    """RMSNorm on each row's queries and keys inside the fused projection's output [T, q + 2 kv],
    in pieces of each norm's size (a head, or the whole projection); the values pass. In place
    where the kernel applies; otherwise split, normalized and joined again."""
    if (kernel is not None and kernel.applies(qkv) and q_weight.dtype == torch.float32
            and k_weight.dtype == torch.float32):
        return kernel.qk_rms_norm(qkv, q_width, k_width, q_weight, k_weight, eps)
    q, k, v = qkv.split([q_width, k_width, qkv.shape[-1] - q_width - k_width], dim=-1)
    q = rms_norm_reference(q.reshape(-1, q_weight.numel()), q_weight, eps).reshape(q.shape)
    k = rms_norm_reference(k.reshape(-1, k_weight.numel()), k_weight, eps).reshape(k.shape)
    return torch.cat([q, k, v], dim=-1)


def silu_and_mul(gate_up: torch.Tensor, kernel: FusedOpsKernel | None) -> torch.Tensor:
    """[T, 2N] -> [T, N]: silu(gate) * up."""
    if kernel is not None and kernel.applies_gated(gate_up):
        return kernel.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor, kernel: FusedOpsKernel | None) -> torch.Tensor:
    """[T, 2N] -> [T, N]: gelu(gate, approximate="tanh") * up (Gemma's GeGLU)."""
    if kernel is not None and kernel.applies_gated(gate_up):
        return kernel.gelu_tanh_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
