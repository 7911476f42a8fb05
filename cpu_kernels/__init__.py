"""pagode's native CPU code: C++ kernels compiled on first use and loaded with ctypes.

    include/            headers: the C ABI each source exports, shared types, inline helpers
    src/                the kernels: paged decode attention, fused prefill attention,
                        block-quantized linear, fused ops, the fused decode step (one
                        library from all of them)
    isa.py              what this CPU can run, detected at run time, and the target level
    build.py            the compiler flags, the sources per level, the cache key, the build
    library.py          load(Settings) -> Library: build or find, open, bind
    paged_attention.py, prefill_attention.py, quant_linear.py, bf16_gemm_kernel.py,
    fused_ops_kernel.py, decode_step_kernel.py
                        the bindings, taking torch tensors (PagedAttentionKernel,
                        PrefillAttentionKernel, BlockLinear, Bf16GemmKernel, FusedOpsKernel,
                        DecodeStepKernel)

The engine depends on this package (engine/native.py hands it the engine's settings), never
the other way round, as with cuda_kernels.
"""

from cpu_kernels.isa import Level
from cpu_kernels.library import Library, Settings, load

__all__ = ["Level", "Library", "Settings", "load"]
