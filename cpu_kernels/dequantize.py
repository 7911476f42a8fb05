"""GGUF block tensors to fp32 (or bf16) in C++ (src/dequantize.cpp), bound to numpy arrays.

Equal, bit for bit, to gguf-py's `gguf.quants.dequantize` for the formats it decodes (Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), spread across the threads; `__call__` gives None for any
other type, and the caller uses gguf-py for those.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

# GGML's type numbers and block sizes (elements, bytes) of the formats the C++ decodes.
BLOCKS = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          12: (256, 144), 13: (256, 176), 14: (256, 210)}


class Dequantizer:
    SYMBOLS = ("dequantize_gguf", "dequantize_gguf_bf16")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.dequantize_gguf.restype = ctypes.c_int
        lib.dequantize_gguf.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
        lib.dequantize_gguf_bf16.restype = ctypes.c_int
        lib.dequantize_gguf_bf16.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                             ctypes.c_int]

    def __call__(self, data: np.ndarray, ggml_type: int, dtype: torch.dtype = torch.float32,
                 out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The tensor's raw bytes (uint8, any shape) as a flat fp32 tensor, or None for a type
        decoded elsewhere. With dtype=torch.bfloat16, those fp32 values rounded as torch's
        `.to(torch.bfloat16)` rounds them, without the fp32 ever being stored. `out`: a
        contiguous tensor of that dtype and size to write them into (a part of a fused weight)."""
        if ggml_type not in BLOCKS:
            return None
        size, nbytes = BLOCKS[ggml_type]
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if raw.size % nbytes:
            raise ValueError(f"{raw.size} bytes are not whole blocks of {nbytes}")
        blocks = raw.size // nbytes
        if out is None:
            out = torch.empty(blocks * size, dtype=dtype)
        if out.dtype != dtype or out.numel() != blocks * size or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous {dtype} tensor of {blocks * size} values")
        decode = self.lib.dequantize_gguf_bf16 if dtype == torch.bfloat16 else self.lib.dequantize_gguf
        done = decode(ggml_type, raw.ctypes.data, blocks, out.data_ptr(), torch.get_num_threads())
        return out if done == 0 else None
