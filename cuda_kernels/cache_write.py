"""reshape_and_cache: scatter a step's new K/V into the paged cache (vLLM's kernel).

An int8 cache gets each (token, KV head) row quantized with its own scale (kv_rows.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cuda_kernels.kv_rows import quantized, store_rows
from cuda_kernels.launch import check_device, last_dim_contiguous


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, QUANT: tl.constexpr,
):
    # One program per token, covering all of its KV heads at once.
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    # slot == -1 marks padding: the mask turns every load and store off.
    # (The interpreter cannot AND a scalar bool into a block, hence the broadcast.)
    keep = (heads * 0 + slot >= 0) & (heads < NUM_KV_HEADS)
    mask = keep[:, None] & (dims[None, :] < HEAD_DIM)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    rows = block * stride_cb + offset * stride_cs + heads * stride_ch
    k = tl.load(key_ptr + t * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask, other=0.0)
    v = tl.load(value_ptr + t * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask, other=0.0)
    store_rows(k_cache_ptr, rows, dims, k, mask, keep, HEAD_DIM, QUANT)
    store_rows(v_cache_ptr, rows, dims, v, mask, keep, HEAD_DIM, QUANT)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """key/value [T, kvh, d] -> kv_cache [2, num_blocks, block_size, kvh, d] at slot_mapping [T]
    (an int8 cache: [.., d + 4], each row's fp32 scale after its values).

    slot = block_id * block_size + offset; slots equal to -1 are skipped.
    """
    num_tokens, kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    check_device(_reshape_and_cache_kernel, key, value, kv_cache, slot_mapping)
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in its last dimension")
    key, value = last_dim_contiguous(key), last_dim_contiguous(value)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(kv_heads), DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=kv_cache.shape[2], QUANT=quantized(kv_cache.dtype),
    )
