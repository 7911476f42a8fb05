"""Host-side helpers shared by the kernel wrappers (no triton import here)."""

from __future__ import annotations

import torch


def runs_interpreted(kernel: object) -> bool:
    """True when `kernel` was decorated under TRITON_INTERPRET=1 (the choice is made then)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_device(kernel: object, *tensors: torch.Tensor) -> None:
    """Compiled kernels need CUDA tensors; the interpreter takes CPU ones."""
    if tensors[0].device.type == "cpu" and not runs_interpreted(kernel):
        raise RuntimeError(
            "Triton kernels got CPU tensors but were compiled for a GPU; set TRITON_INTERPRET=1 "
            "before importing cuda_kernels' kernels to run them on the CPU (slow, for testing)")
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")


def last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Kernels index the last dim with unit stride; other dims may be strided views."""
    return x if x.stride(-1) == 1 else x.contiguous()
