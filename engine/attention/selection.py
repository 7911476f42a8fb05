"""Which attention backend a device gets: the one module that knows them all."""

from __future__ import annotations

import torch

from engine import envs
from engine.attention.backend import AttentionBackend
from engine.attention.sdpa_backend import SdpaAttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend

BACKENDS = ("torch", "sdpa", "triton")


def select_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """torch on CPU, triton on CUDA; PAGODE_ATTENTION_BACKEND or `name` overrides.

    torch: C++ kernels where they build (the CPU), pure torch elsewhere; sdpa: pure torch
    always (gather + scaled_dot_product_attention), the reference to compare against;
    triton: the kernels of cuda_kernels.
    """
    choice = name or envs.ATTENTION_BACKEND.get() or (
        "triton" if device.type == "cuda" else "torch")
    if choice == "torch":
        return TorchAttentionBackend()
    if choice == "sdpa":
        return SdpaAttentionBackend()
    if choice == "triton":
        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {choice!r}; choose one of {', '.join(BACKENDS)}")
