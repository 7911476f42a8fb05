"""Rows of the paged K/V cache in the Triton kernels: plain, or int8 with a scale per row.

An int8 cache row (engine/attention/kv_int8.py) holds HEAD_DIM int8 values, then their
fp32 scale (max |x| / 127) at element HEAD_DIM of the same row. The kernels load rows as
fp32 through load_rows and write them through store_rows, so the attention code is the
same for every cache dtype; QUANT (constexpr) compiles the int8 handling in or out.
"""

from __future__ import annotations

import triton
import triton.language as tl

# 1.5 * 2**23: adding and subtracting it rounds an fp32 of magnitude below 2**22 to the
# nearest integer, ties to even, as torch.round and the C++ kernels' conversions do.
ROUND_MAGIC: tl.constexpr = tl.constexpr(12582912.0)


@triton.jit
def _scale_ptrs(cache_ptr, rows, HEAD_DIM: tl.constexpr):
    """The fp32 scale of each row, stored after its values."""
    return (cache_ptr + rows + HEAD_DIM).to(tl.pointer_type(tl.float32))


@triton.jit
def load_rows(cache_ptr, rows, dims, mask, row_mask, HEAD_DIM: tl.constexpr, QUANT: tl.constexpr):
    """Rows starting at element offsets rows [N], columns dims -> [N, DIM_PAD]; int8 rows
    come back as fp32 values times their scale, others in the cache's dtype."""
    x = tl.load(cache_ptr + rows[:, None] + dims[None, :], mask=mask, other=0.0)
    if QUANT:
        scale = tl.load(_scale_ptrs(cache_ptr, rows, HEAD_DIM), mask=row_mask, other=0.0)
        x = x.to(tl.float32) * scale[:, None]
    return x


@triton.jit
def store_rows(cache_ptr, rows, dims, x, mask, row_mask, HEAD_DIM: tl.constexpr, QUANT: tl.constexpr):
    """Write x [N, DIM_PAD] (masked columns must hold 0) to rows at element offsets rows [N]:
    converted to the cache's dtype, or quantized with a scale per row for int8."""
    if QUANT:
        x = x.to(tl.float32)
        scale = tl.max(tl.abs(x), axis=1) / 127.0
        safe = tl.where(scale > 0, scale, 1.0)
        q = tl.div_rn(x, safe[:, None])
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        q = (q + ROUND_MAGIC) - ROUND_MAGIC
        q = tl.where(scale[:, None] > 0, q, 0.0)
        tl.store(cache_ptr + rows[:, None] + dims[None, :], q.to(tl.int8), mask=mask)
        tl.store(_scale_ptrs(cache_ptr, rows, HEAD_DIM), scale, mask=row_mask)
    else:
        tl.store(cache_ptr + rows[:, None] + dims[None, :], x.to(cache_ptr.dtype.element_ty), mask=mask)


def quantized(cache_dtype: object) -> bool:
    """Whether a cache of this torch dtype holds int8 rows with scales."""
    return str(cache_dtype) == "torch.int8"

