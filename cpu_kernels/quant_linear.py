"""The block-quantized linear kernel (C++, AVX2 + OpenMP), compiled on first use and cached.

Like the CPU attention kernel it is a plain C function loaded with ctypes: it builds with
the system g++ in about two seconds and needs no torch headers. Without a compiler the
quantized layers run on fbgemm alone and `--quantization auto` falls back to `none`.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

from engine import envs, native
from engine.quant.formats import BlockWeights

log = logging.getLogger("pagode")

_SOURCE = Path(__file__).parent / "csrc" / "quant_linear_cpu.cpp"
# No contraction of the scalar arithmetic, like the other CPU kernels: the fused decode step
# (engine/model/decode_step.py) compiles this file with them and must give the same numbers.
_FLAGS = [*native.CPU_FLAGS, "-ffp-contract=off"]
_P = ctypes.c_void_p
_I64 = ctypes.c_int64


def _declare(lib: ctypes.CDLL) -> None:
    lib.linear_q4_1.restype = None
    lib.linear_q4_1.argtypes = [_P] * 6 + [_I64] * 3 + [ctypes.c_int]
    lib.linear_q8_0.restype = None
    lib.linear_q8_0.argtypes = [_P] * 5 + [_I64] * 3 + [ctypes.c_int]
    lib.quant_kernel_uses_avx2.restype = ctypes.c_int


KERNEL = native.Kernel(_SOURCE, _FLAGS, _declare, switch=envs.QUANT_KERNEL)
load = KERNEL.load  # the library, or None when it cannot be built here (or PAGODE_QUANT_KERNEL=0)


def available() -> bool:
    return load() is not None


def uses_avx2() -> bool:
    lib = load()
    return lib is not None and bool(lib.quant_kernel_uses_avx2())


def block_linear(x: torch.Tensor, w: BlockWeights, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 -> [M, N] fp32 on the block-quantized weight w [N, K]."""
    lib = load()
    assert lib is not None, "the quantized-linear kernel is not available"
    x = x.contiguous()
    m, k = x.shape
    if k != w.in_features:
        raise ValueError(f"input has {k} features, the weight expects {w.in_features}")
    y = torch.empty(m, w.out_features, dtype=torch.float32)
    b = 0 if bias is None else bias.data_ptr()
    threads = torch.get_num_threads()
    if w.kind == "q4_1":
        assert w.mins is not None
        lib.linear_q4_1(x.data_ptr(), w.qs.data_ptr(), w.scales.data_ptr(), w.mins.data_ptr(), b,
                        y.data_ptr(), m, w.out_features, k, threads)
    else:
        lib.linear_q8_0(x.data_ptr(), w.qs.data_ptr(), w.scales.data_ptr(), b, y.data_ptr(),
                        m, w.out_features, k, threads)
    return y
