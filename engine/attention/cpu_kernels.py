"""The CPU paged-attention kernel (C++ with OpenMP), compiled on first use and cached.

It is a plain C function loaded with ctypes, so it builds in about a second with
the system compiler and needs no torch headers. Without a compiler the torch
backend keeps its pure-torch path, which gathers only the batch's blocks.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger("pagode")

_SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
_lib: ctypes.CDLL | None = None
_failed = False
_I64 = ctypes.c_int64


def _cache_path() -> Path:
    digest = hashlib.sha256(_SOURCE.read_bytes() + " ".join(_FLAGS).encode()).hexdigest()[:16]
    root = Path(os.environ.get("PAGODE_CACHE_DIR", Path.home() / ".cache" / "pagode"))
    return root / "kernels" / f"paged_attention_cpu-{digest}.so"


def _build(target: Path) -> None:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run([compiler, *_FLAGS, str(_SOURCE), "-o", str(built)], check=True,
                       capture_output=True, text=True)
        built.replace(target)  # atomic: concurrent builders never see half a file


def load() -> ctypes.CDLL | None:
    """The compiled library, or None when it cannot be built here (or PAGODE_CPU_KERNEL=0)."""
    global _lib, _failed
    if _lib is not None or _failed:
        return _lib
    if os.environ.get("PAGODE_CPU_KERNEL", "1") == "0":
        _failed = True
        return None
    target = _cache_path()
    try:
        if not target.exists():
            log.info("compiling the CPU paged-attention kernel into %s", target)
            _build(target)
        lib = ctypes.CDLL(str(target))
        lib.paged_decode_attention_f32.restype = None
        lib.paged_decode_attention_f32.argtypes = [ctypes.c_void_p] * 6 + [_I64] * 6 + [
            ctypes.c_float, ctypes.c_int]
        _lib = lib
    except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        log.warning("CPU paged-attention kernel unavailable (%s); using the pure-torch path", detail)
        _failed = True
    return _lib


def paged_decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """query [B, H, D] fp32 -> [B, H, D], reading kv_cache [2, NB, BS, KVH, D] in place."""
    lib = load()
    assert lib is not None
    q = query.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    _, _, block_size, kv_heads, head_dim = kv_cache.shape
    lib.paged_decode_attention_f32(
        q.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), tables.data_ptr(),
        lens.data_ptr(), out.data_ptr(), q.shape[0], q.shape[1], head_dim, block_size, kv_heads,
        tables.shape[1], scale, torch.get_num_threads())
    return out


def available(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.float32 and load() is not None
