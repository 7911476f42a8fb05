"""Paged prefill/extend attention: chunks of new tokens on top of cached positions.

Sequences are packed varlen by cu_seqlens_q. A chunk of q_len tokens of a sequence
with seq_len positions (its own K/V already written to the cache) has
context_len = seq_len - q_len cached positions before it; token i sees positions
[0, context_len + i]: full over the cached part, causal within the chunk.

One program takes BLOCK_M rows of one (sequence, KV head), a row being a
(token, query head of the group) pair, so each K/V tile is loaded once for the whole
GQA group. K/V positions are looked up through the block table in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cuda_kernels.decode_attention import M_INIT, _mma, _soft_cap, upcast_dots, window_args
from cuda_kernels.kv_rows import load_rows, quantized
from cuda_kernels.launch import check_device, last_dim_contiguous


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, cu_seqlens_ptr,
    out_ptr, scale,
    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
    window, softcap,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, QUANT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + b)
    q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    context = seq_len - q_len

    row = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = row < q_len * GROUP
    tok = row // GROUP
    heads = kv_head * GROUP + row % GROUP
    dims = tl.arange(0, DIM_PAD)
    q_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q_offs = (q_start + tok).to(tl.int64)[:, None] * stride_qt + heads[:, None] * stride_qh
    q = tl.load(q_ptr + q_offs + dims[None, :], mask=q_mask, other=0.0)

    # The tile's last token bounds the keys it may see; 0 when the tile is past the chunk.
    last_tok = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
    kv_end = tl.where(pid_m * BLOCK_M < q_len * GROUP, context + last_tok + 1, 0)
    limit = context + tok  # last visible position per row
    # A window hides positions <= limit - window; keys before the tile's first row's
    # window are never read.
    kv_start = 0
    if HAS_WINDOW:
        first_tok = tl.minimum(pid_m * BLOCK_M // GROUP, q_len - 1)
        kv_start = tl.maximum(context + first_tok - window + 1, 0) // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], M_INIT, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_PAD], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    for start in range(kv_start, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < kv_end
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        rows = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_mask = valid[:, None] & (dims[None, :] < HEAD_DIM)
        k = load_rows(k_cache_ptr, rows, dims, kv_mask, valid, HEAD_DIM, QUANT)
        s = _mma(q, tl.trans(k.to(q.dtype)), UPCAST) * scale
        if HAS_SOFTCAP:
            s = _soft_cap(s, softcap)
        visible = valid[None, :] & (pos[None, :] <= limit[:, None])
        if HAS_WINDOW:
            visible = visible & (pos[None, :] > limit[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_rows(v_cache_ptr, rows, dims, kv_mask, valid, HEAD_DIM, QUANT)
        acc = acc * alpha[:, None] + _mma(p.to(q.dtype), v.to(q.dtype), UPCAST)
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_offs = (q_start + tok).to(tl.int64)[:, None] * stride_ot + heads[:, None] * stride_oh
    tl.store(out_ptr + o_offs + dims[None, :], acc.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(query: torch.Tensor, kv_cache: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                            block_tables: torch.Tensor, scale: float,
                            max_query_len: int, window: int | None = None,
                            softcap: float | None = None) -> torch.Tensor:
    """query [Tq, H, d] packed by cu_seqlens_q [B+1] int32 -> [Tq, H, d].

    seq_lens [B] int32 count cached + new positions; block_tables [B, max_blocks] int32.
    The chunk's own K/V must already be in the cache (write_kv runs first). window /
    softcap as AttentionBackend.prefill.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, kv_heads, _ = kv_cache.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads")
    out = torch.empty_like(query)
    batch = seq_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    check_device(_prefill_kernel, query, kv_cache, cu_seqlens_q, seq_lens, block_tables)
    query = last_dim_contiguous(query)
    group = num_heads // kv_heads
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    block_m = 64
    grid = (triton.cdiv(max_query_len * group, block_m), batch, kv_heads)
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, out, scale,
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_N=max(32, block_size),
        UPCAST=upcast_dots(query.dtype), num_warps=4, **window_args(window, softcap), QUANT=quantized(kv_cache.dtype),
    )
    return out
