"""The engine's side of cpu_kernels: pagode's switches (engine.envs) in, kernels out.

cpu_kernels reads no environment; this adapter reads the variables when a kernel is asked
for and hands them in: the cache directory ($PAGODE_CACHE_DIR/kernels), the ISA cap
(PAGODE_CPU_ISA), the compiler ($CXX), and the on/off switches (PAGODE_CPU_KERNEL=0
turns every kernel off, PAGODE_QUANT_KERNEL=0 the block-quantized linear). Each function
gives a kernel family, or None where it is off or not built here; callers keep their
pure-torch paths for None. The library itself is built and opened once per settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpu_kernels import Level, Library, Settings, load
from cpu_kernels.bf16_gemm_kernel import Bf16GemmKernel
from cpu_kernels.decode_step_kernel import DecodeStepKernel
from cpu_kernels.dequantize import Dequantizer
from cpu_kernels.fused_ops_kernel import FusedOpsKernel
from cpu_kernels.isa import detect, target_level
from cpu_kernels.lora_delta_kernel import LoraDeltaKernel
from cpu_kernels.paged_attention import PagedAttentionKernel
from cpu_kernels.prefill_attention import PrefillAttentionKernel
from cpu_kernels.quant_linear import BlockLinear
from engine import envs


def settings() -> Settings:
    cap = envs.CPU_ISA.get()
    return Settings(cache_dir=envs.CACHE_DIR.get() / "kernels",
                    isa_cap=None if cap is None else Level.parse(cap), compiler=envs.CXX.get())


@dataclass(frozen=True)
class CpuTarget:
    """What this CPU can run and what pagode's kernels target on it (PAGODE_CPU_ISA caps it)."""

    model: str
    flags: tuple[str, ...]  # the ISA flags that matter here, as /proc/cpuinfo lists them
    detected: str  # the highest level the CPU (and, for AMX, the OS) allows
    target: str  # the level the kernels are built for
    cap: str | None
    amx_permitted: bool

    def describe(self) -> str:
        capped = "" if self.cap is None else f", capped by PAGODE_CPU_ISA={self.cap}"
        return (f"{self.model or 'unknown CPU'}: can run {self.detected}, kernels for "
                f"{self.target}{capped} (flags: {' '.join(self.flags) or 'none of the known ones'})")


def cpu_target() -> CpuTarget:
    cpu, cap = detect(), settings().isa_cap
    return CpuTarget(cpu.model, tuple(sorted(cpu.flags)), cpu.level.label,
                     target_level(cpu, cap).label, None if cap is None else cap.label,
                     cpu.amx_permitted)


def library() -> Library | None:
    """The CPU kernels, or None with PAGODE_CPU_KERNEL=0 or where they cannot be built."""
    return load(settings()) if envs.CPU_KERNEL.get() else None


def paged_attention() -> PagedAttentionKernel | None:
    lib = library()
    return None if lib is None else lib.paged_attention


def prefill_attention() -> PrefillAttentionKernel | None:
    lib = library()
    return None if lib is None else lib.prefill_attention


def block_linear() -> BlockLinear | None:
    lib = library()
    kernel = None if lib is None or not envs.QUANT_KERNEL.get() else lib.block_linear
    if kernel is not None:
        kernel.set_tile_bf16(envs.TILE_BF16.get())
    return kernel


def bf16_dot_products() -> bool:
    """The CPU has bf16 dot products (AVX512-BF16 or AMX-BF16) and PAGODE_CPU_ISA lets pagode
    use them: elsewhere bf16 arithmetic is emulated and never pays."""
    target = cpu_target()
    return target.target in ("avx512", "amx") and any(f in target.flags for f in ("avx512_bf16", "amx_bf16"))


def bf16_gemm() -> Bf16GemmKernel | None:
    """The AMX bf16 GEMM for steps of tens of tokens (amx builds only)."""
    lib = library()
    return None if lib is None else lib.bf16_gemm


def fused_ops() -> FusedOpsKernel | None:
    lib = library()
    return None if lib is None else lib.fused_ops


def decode_step() -> DecodeStepKernel | None:
    lib = library()
    return None if lib is None else lib.decode_step


def lora_delta() -> LoraDeltaKernel | None:
    lib = library()
    return None if lib is None else lib.lora_delta


def dequantizer() -> Dequantizer | None:
    lib = library()
    return None if lib is None else lib.dequantize
