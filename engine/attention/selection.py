"""Which attention backend a device gets: the one module that knows them all."""

from __future__ import annotations

import logging

import torch

from engine import envs
from engine.attention.backend import AttentionBackend
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.sdpa_backend import SdpaAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend

log = logging.getLogger("pagode")

BACKENDS = ("cpu", "sdpa", "triton")
DEPRECATED_ALIASES = {"torch": "cpu"}  # old name -> backend


def select_backend(name: str | None, device: torch.device) -> AttentionBackend:
    """cpu on the CPU, triton on CUDA; PAGODE_ATTENTION_BACKEND or `name` overrides.

    cpu: C++ kernels where they build, pure torch elsewhere; sdpa: pure torch always
    (gather + scaled_dot_product_attention), the reference to compare against; triton: the
    kernels of cuda_kernels.
    """
    choice = resolve_name(name or envs.ATTENTION_BACKEND.get() or ("triton" if device.type == "cuda" else "cpu"))
    if choice == "cpu":
        return CpuAttentionBackend()
    if choice == "sdpa":
        return SdpaAttentionBackend()
    return TritonAttentionBackend()


def resolve_name(name: str) -> str:
    """A backend's name; an old alias maps to its backend, with a warning."""
    if name in DEPRECATED_ALIASES:
        log.warning("attention backend %r is deprecated; use %r", name, DEPRECATED_ALIASES[name])
        return DEPRECATED_ALIASES[name]
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name
