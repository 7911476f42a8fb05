"""Triton kernels for paged attention on GPUs, runnable on CPU under TRITON_INTERPRET=1.

`import cuda_kernels` never imports triton: the kernel modules load on first use of
a kernel name, so (a) the package imports where triton is missing, and (b) setting
TRITON_INTERPRET=1 any time before that first use selects the interpreter (the
choice is made when the kernels are decorated, not when triton is imported).
The kernel tests' torch oracle lives with the benchmarks: benchmarks/kernel_reference.py.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuda_kernels.cache_write import reshape_and_cache
    from cuda_kernels.decode_attention import paged_decode_attention
    from cuda_kernels.prefill_attention import paged_prefill_attention

_LAZY = {
    "reshape_and_cache": "cuda_kernels.cache_write",
    "paged_decode_attention": "cuda_kernels.decode_attention",
    "paged_prefill_attention": "cuda_kernels.prefill_attention",
}

__all__ = [
    "is_interpreted",
    "paged_decode_attention",
    "paged_prefill_attention",
    "reshape_and_cache",
    "triton_available",
]


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def is_interpreted() -> bool:
    """True when the kernels were decorated under TRITON_INTERPRET=1 (this imports them)."""
    from cuda_kernels.cache_write import _reshape_and_cache_kernel
    from cuda_kernels.launch import runs_interpreted

    return runs_interpreted(_reshape_and_cache_kernel)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cuda_kernels' has no attribute {name!r}")
