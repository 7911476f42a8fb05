"""Paged decode attention: one new query token per sequence, K/V read in place.

Each program takes one (sequence, KV head, split): the query heads of the KV head's
group form the rows of one tile, so each K/V page is loaded once per group (GQA).
Positions are looked up through the block table position by position, so a tile of
BLOCK_N positions may span several pages and page ids need not be contiguous.

With num_splits > 1 (vLLM's v2 / flash-decoding), a sequence's tiles are divided
evenly among the splits *inside the kernel*, from its own seq_len; the grid only
depends on (batch, kv_heads, num_splits), so one launch shape serves every context
length, which is what CUDA-graph replay needs. A reduce kernel merges the partial
softmax states.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cuda_kernels.kv_rows import load_rows, quantized
from cuda_kernels.launch import check_device, last_dim_contiguous, runs_interpreted

# Finite "minus infinity" for running maxima: exp(M_INIT - M_INIT) = 1, never NaN.
M_INIT: tl.constexpr = tl.constexpr(-1.0e30)
MAX_SPLITS = 32
PARTITION_TOKENS = 256  # vLLM v2 splits every 512 tokens; smaller favours occupancy


@triton.jit
def _mma(a, b, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32.

    "ieee" keeps fp32 inputs exact (the TF32 default errs by ~1e-3); fp16/bf16 inputs
    still use tensor cores. UPCAST emulates bf16 tensor cores (exact bf16 products,
    fp32 sums) for the interpreter, whose own bf16 dot is wrong.
    """
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _soft_cap(s, softcap):
    """softcap * tanh(s / softcap): Gemma 2's logit cap (tanh through a sigmoid, which
    Triton has on every backend: tanh(x) = 2 sigmoid(2x) - 1)."""
    return softcap * (2.0 * tl.sigmoid(2.0 * (s / softcap)) - 1.0)


def window_args(window: int | None, softcap: float | None) -> dict[str, object]:
    """The kernels' window/softcap arguments: 0 stands for none, and the two flags are
    constexpr so a layer without either compiles to the plain kernel."""
    return {"window": window or 0, "softcap": softcap or 0.0,
            "HAS_WINDOW": window is not None, "HAS_SOFTCAP": softcap is not None}


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, m_ptr, l_ptr, scale,
    stride_qb, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
    stride_ob, stride_oh, stride_os, stride_mb, stride_mh, window, softcap,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, UPCAST: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, QUANT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    # A window's first visible position; the tiles before its tile are never read.
    first = 0
    if HAS_WINDOW:
        first = tl.maximum(seq_len - window, 0)
    first_tile = first // BLOCK_N
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles - first_tile, NUM_SPLITS)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    dims = tl.arange(0, DIM_PAD)
    q_mask = (g[:, None] < GROUP) & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=q_mask,
                other=0.0)

    m_i = tl.full([GROUP_PAD], M_INIT, dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], dtype=tl.float32)
    table = block_tables_ptr + b * stride_bt
    for tile in range(tile_lo, tile_hi):
        pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = (pos < seq_len) & (pos >= first)
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        rows = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_mask = valid[:, None] & (dims[None, :] < HEAD_DIM)
        k = load_rows(k_cache_ptr, rows, dims, kv_mask, valid, HEAD_DIM, QUANT)
        s = _mma(q, tl.trans(k.to(q.dtype)), UPCAST) * scale
        if HAS_SOFTCAP:
            s = _soft_cap(s, softcap)
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_rows(v_cache_ptr, rows, dims, kv_mask, valid, HEAD_DIM, QUANT)
        acc = acc * alpha[:, None] + _mma(p.to(q.dtype), v.to(q.dtype), UPCAST)
        m_i = m_new

    out_offs = b * stride_ob + heads[:, None] * stride_oh + dims[None, :]
    if NUM_SPLITS == 1:
        acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        # Unnormalized partial state; the reduce kernel rescales and normalizes.
        tl.store(out_ptr + out_offs + split * stride_os, acc, mask=q_mask)
        ml_offs = b * stride_mb + heads * stride_mh + split
        tl.store(m_ptr + ml_offs, m_i, mask=g < GROUP)
        tl.store(l_ptr + ml_offs, l_i, mask=g < GROUP)


@triton.jit
def _reduce_kernel(
    partial_ptr, m_ptr, l_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_mb, stride_mh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, DIM_PAD)
    s_mask = splits < NUM_SPLITS
    ml_offs = b * stride_mb + h * stride_mh + splits
    maxes = tl.load(m_ptr + ml_offs, mask=s_mask, other=M_INIT)
    sums = tl.load(l_ptr + ml_offs, mask=s_mask, other=0.0)
    # Empty splits carry max = M_INIT and sum = 0, so their weight below is 0.
    weight = tl.exp(maxes - tl.max(maxes, axis=0))
    total = tl.sum(sums * weight, axis=0)
    mask = s_mask[:, None] & (dims[None, :] < HEAD_DIM)
    part = tl.load(partial_ptr + b * stride_pb + h * stride_ph + splits[:, None] * stride_ps
                   + dims[None, :], mask=mask, other=0.0)
    out = tl.sum(part * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def choose_num_splits(batch: int, kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Split long contexts until the grid roughly fills the GPU (vLLM v2's trade-off)."""
    if device.type != "cuda":
        return max(1, min(MAX_SPLITS, triton.cdiv(max_seq_len, 4 * PARTITION_TOKENS)))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = triton.cdiv(2 * sms, max(1, batch * kv_heads))
    by_length = triton.cdiv(max_seq_len, PARTITION_TOKENS)
    return max(1, min(MAX_SPLITS, wanted, by_length))


def upcast_dots(dtype: torch.dtype) -> bool:
    return dtype == torch.bfloat16 and runs_interpreted(_decode_kernel)


def paged_decode_attention(query: torch.Tensor, kv_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           num_splits: int | None = None,
                           max_seq_len: int | None = None, window: int | None = None,
                           softcap: float | None = None) -> torch.Tensor:
    """query [B, H, d] over kv_cache [2, nb, bs, kvh, d] -> [B, H, d] (an int8 cache is
    [.., d + 4], each row's scale after its values: kv_rows.py).

    block_tables [B, max_blocks] int32, seq_lens [B] int32 (cached positions including
    the new token, already written). num_splits None picks one from max_seq_len
    (read from seq_lens when not given, which syncs on a GPU). Under CUDA graphs pass
    a fixed num_splits or max_seq_len: any split count is correct for any seq_lens.
    window / softcap: a sliding window over the last `window` positions, and Gemma 2's
    logit soft-cap (AttentionBackend.decode).
    """
    batch, num_heads, head_dim = query.shape
    _, _, block_size, kv_heads, _ = kv_cache.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads")
    out = torch.empty_like(query)
    if batch == 0:
        return out
    check_device(_decode_kernel, query, kv_cache, block_tables, seq_lens)
    query = last_dim_contiguous(query)
    if num_splits is None:
        longest = max_seq_len if max_seq_len is not None else int(seq_lens.max())
        num_splits = choose_num_splits(batch, kv_heads, longest, query.device)
    group = num_heads // kv_heads
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    if num_splits == 1:
        partial, maxes, sums = out.unsqueeze(2), out, out  # maxes/sums unused with one split
    else:
        partial = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32,
                              device=query.device)
        maxes = torch.empty(batch, num_heads, num_splits, dtype=torch.float32,
                            device=query.device)
        sums = torch.empty_like(maxes)
    dim_pad = triton.next_power_of_2(head_dim)
    _decode_kernel[(batch, kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, partial, maxes, sums, scale,
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), block_tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2), maxes.stride(0), maxes.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        DIM_PAD=dim_pad, BLOCK_SIZE=block_size, BLOCK_N=max(64, block_size),
        NUM_SPLITS=num_splits, UPCAST=upcast_dots(query.dtype), num_warps=4,
        **window_args(window, softcap), QUANT=quantized(kv_cache.dtype),
    )
    if num_splits > 1:
        _reduce_kernel[(batch, num_heads)](
            partial, maxes, sums, out,
            partial.stride(0), partial.stride(1), partial.stride(2), maxes.stride(0), maxes.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, DIM_PAD=dim_pad, NUM_SPLITS=num_splits,
            SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=4,
        )
    return out
