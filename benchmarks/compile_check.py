"""Compile every kernel for a GPU architecture without a GPU: catches what the
interpreter cannot (tl.dot shape limits, types that only matter in compiled code).

    python -m benchmarks.compile_check            # sm_90, fp16/bf16/fp32, and each over an int8 cache
    python -m benchmarks.compile_check --quick    # one dtype (and an int8 cache), the test suite's check

Needs triton's bundled ptxas, not a device. Must run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile kernels")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from cuda_kernels.cache_write import _reshape_and_cache_kernel  # noqa: E402
from cuda_kernels.decode_attention import _decode_kernel, _reduce_kernel  # noqa: E402
from cuda_kernels.prefill_attention import _prefill_kernel  # noqa: E402


def compile_kernel(fn: Any, pointer_types: dict[str, str], constexprs: dict[str, Any],
                   target: GPUTarget) -> dict[str, Any]:
    """Arguments not named are int32 scalars (strides); returns the kernel's metadata."""
    names = fn.arg_names
    signature = {n: "constexpr" if n in constexprs else pointer_types.get(n, "i32")
                 for n in names}
    src = ASTSource(fn, signature,
                    constexprs={(names.index(k),): v for k, v in constexprs.items()})
    kernel = triton.compile(src, target=target, options={"num_warps": 4})
    return {"name": fn.__name__, "shared": kernel.metadata.shared, **constexprs}


def kernel_specs(dt: str, group: int, head_dim: int, block_size: int, cache_dt: str | None = None) -> list[tuple]:
    """(kernel, pointer types, constexprs) as the wrappers launch them for this shape; the
    cache in dt unless cache_dt names another (*i8: int8 rows with their scales)."""
    pad = triton.next_power_of_2(head_dim)
    cache_dt = cache_dt or dt
    quant = cache_dt == "*i8"
    cache = {"k_cache_ptr": cache_dt, "v_cache_ptr": cache_dt, "block_tables_ptr": "*i32",
             "seq_lens_ptr": "*i32", "scale": "fp32"}
    decode = dict(GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
                  HEAD_DIM=head_dim, DIM_PAD=pad, BLOCK_SIZE=block_size,
                  BLOCK_N=max(64, block_size), UPCAST=False, QUANT=quant)
    return [
        (_reshape_and_cache_kernel, {"key_ptr": dt, "value_ptr": dt, "k_cache_ptr": cache_dt,
                                     "v_cache_ptr": cache_dt, "slot_ptr": "*i64"},
         dict(NUM_KV_HEADS=8, HEAD_DIM=head_dim, HEADS_PAD=8, DIM_PAD=pad,
              BLOCK_SIZE=block_size, QUANT=quant)),
        (_decode_kernel, {"q_ptr": dt, "out_ptr": dt, "m_ptr": dt, "l_ptr": dt, **cache},
         dict(decode, NUM_SPLITS=1)),
        (_decode_kernel, {"q_ptr": dt, "out_ptr": "*fp32", "m_ptr": "*fp32", "l_ptr": "*fp32",
                          **cache}, dict(decode, NUM_SPLITS=4)),
        (_reduce_kernel, {"partial_ptr": "*fp32", "m_ptr": "*fp32", "l_ptr": "*fp32",
                          "out_ptr": dt},
         dict(HEAD_DIM=head_dim, DIM_PAD=pad, NUM_SPLITS=4, SPLITS_PAD=4)),
        (_prefill_kernel, {"q_ptr": dt, "out_ptr": dt, "cu_seqlens_ptr": "*i32", **cache},
         dict(GROUP=group, HEAD_DIM=head_dim, DIM_PAD=pad, BLOCK_SIZE=block_size, BLOCK_M=64,
              BLOCK_N=max(32, block_size), UPCAST=False, QUANT=quant)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_check",
                                     description="compile the kernels for a GPU, offline")
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 80, 90")
    parser.add_argument("--quick", action="store_true", help="fp16, one shape")
    args = parser.parse_args(argv)
    target = GPUTarget("cuda", args.arch, 32)
    dtypes = ["*fp16"] if args.quick else ["*fp16", "*bf16", "*fp32"]
    shapes = [(4, 128, 16)] if args.quick else [(4, 128, 16), (9, 64, 32), (2, 16, 16)]
    for dt in dtypes:
        for (group, head_dim, block_size), cache_dt in [*((s, None) for s in shapes), (shapes[0], "*i8")]:
            for fn, pointers, consts in kernel_specs(dt, group, head_dim, block_size, cache_dt):
                info = compile_kernel(fn, pointers, consts, target)
                print(f"sm_{args.arch} {dt[1:]:>4} cache {(cache_dt or dt)[1:]:>4} ok: {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
