"""Load the CPU kernels: detect the CPU, build (or find) the library for its level, bind it.

The caller says where the cache lives, the ISA cap and the compiler (`Settings`); this
package reads no environment of its own. `load` is memoized per Settings, so the CPU is
reported and the library opened once per process. Each kernel family is an attribute of
`Library`, None where the library holds no such symbols (below its level); the whole
library is None when it cannot be built here (no compiler, a failed build).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cpu_kernels import build, isa
from cpu_kernels.bf16_gemm_kernel import Bf16GemmKernel
from cpu_kernels.decode_step_kernel import DecodeStepKernel
from cpu_kernels.dequantize import Dequantizer
from cpu_kernels.fused_ops_kernel import FusedOpsKernel
from cpu_kernels.lora_delta_kernel import LoraDeltaKernel
from cpu_kernels.paged_attention import PagedAttentionKernel
from cpu_kernels.prefill_attention import PrefillAttentionKernel
from cpu_kernels.quant_linear import BlockLinear

log = logging.getLogger("pagode.cpu_kernels")


@dataclass(frozen=True)
class Settings:
    """What the loader needs from its caller."""

    cache_dir: Path  # where compiled libraries are kept
    isa_cap: isa.Level | None = None  # build for at most this level
    compiler: str | None = None  # a C++ compiler (name or path); None: g++ or c++ from PATH


class Library:
    """The compiled kernels for one ISA level, one binding per kernel family."""

    def __init__(self, lib: ctypes.CDLL, level: isa.Level, path: Path) -> None:
        self.level, self.path = level, path
        # A family is None when the library lacks one of its symbols (not built at this level).
        self.paged_attention = PagedAttentionKernel(lib) if _has(lib, PagedAttentionKernel.SYMBOLS) else None
        self.block_linear = BlockLinear(lib) if _has(lib, BlockLinear.SYMBOLS) else None
        self.fused_ops = FusedOpsKernel(lib) if _has(lib, FusedOpsKernel.SYMBOLS) else None
        self.decode_step = DecodeStepKernel(lib) if _has(lib, DecodeStepKernel.SYMBOLS) else None
        self.lora_delta = LoraDeltaKernel(lib) if _has(lib, LoraDeltaKernel.SYMBOLS) else None
        self.prefill_attention = (PrefillAttentionKernel(lib) if _has(lib, PrefillAttentionKernel.SYMBOLS)
                                  else None)
        self.dequantize = Dequantizer(lib) if _has(lib, Dequantizer.SYMBOLS) else None
        self.bf16_gemm = Bf16GemmKernel(lib) if _has(lib, Bf16GemmKernel.SYMBOLS) else None


def _has(lib: ctypes.CDLL, symbols: tuple[str, ...]) -> bool:
    return all(hasattr(lib, name) for name in symbols)


@functools.cache
def load(settings: Settings) -> Library | None:
    """The kernels for this CPU, built on first use; None (with a warning) when they cannot be."""
    cpu = isa.detect()
    level = isa.target_level(cpu, settings.isa_cap)
    capped = f", capped from {cpu.level.label}" if level < cpu.level else ""
    log.info("CPU kernels: %s; target level %s%s", cpu.describe(), level.label, capped)
    try:
        compiler = build.find_compiler(settings.compiler)
        path = build.library_path(settings.cache_dir, level, compiler)
        if not path.exists():
            log.info("compiling the CPU kernels (%s, %s) into %s", level.label,
                     " ".join(build.ISA_FLAGS[level]) or "no ISA flags", path)
            build.compile_library(path, level, compiler)
        return Library(ctypes.CDLL(str(path)), level, path)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or err
        log.warning("CPU kernels unavailable (%s); using the pure-torch paths", detail)
        return None
