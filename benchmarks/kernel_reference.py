"""The paged attention kernels' oracle: plain gather-based paged attention in torch.

Deliberately simple and slow: every function gathers a sequence's K/V through its
block table into contiguous tensors, then applies the textbook formula in fp32.
The kernel tests check the Triton and C++ kernels against it and
`python -m benchmarks.bench_kernels` times it beside the Triton kernel, so it lives with
the benchmarks, where both read it. The engine's optimized CPU backend lives elsewhere
(engine/attention/cpu_backend.py).
"""

from __future__ import annotations

import torch


def reshape_and_cache_ref(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, kvh, d] to slots of kv_cache [2, nb, bs, kvh, d]; -1 skips."""
    _, num_blocks, block_size, kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, kv_heads, head_dim)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    flat[0, slots] = key[keep].to(kv_cache.dtype)
    flat[1, slots] = value[keep].to(kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor,
              length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V [length, kvh, d] of one sequence, read position by position (an int8 cache's
    rows as their values times their scale)."""
    block_size = kv_cache.shape[2]
    pos = torch.arange(length, device=kv_cache.device)
    blocks = block_table.long()[pos // block_size]
    offsets = pos % block_size
    return as_values(kv_cache[0, blocks, offsets]), as_values(kv_cache[1, blocks, offsets])


def as_values(rows: torch.Tensor) -> torch.Tensor:
    """Cache rows as the numbers they stand for: an int8 row [d + 4] is d int8 values and
    then their fp32 scale (its 4 bytes); other dtypes are the numbers themselves."""
    if rows.dtype != torch.int8:
        return rows
    d = rows.shape[-1] - 4
    return rows[..., :d].float() * rows[..., d:].contiguous().view(torch.float32)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           visible: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
    """q [n, H, d], k/v [L, kvh, d], visible [n, L] bool -> [n, H, d] in fp32.

    softcap: scores become softcap * tanh(score / softcap) before the mask (Gemma 2)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, v)


def paged_decode_attention_ref(query: torch.Tensor, kv_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor,
                               scale: float, window: int | None = None,
                               softcap: float | None = None) -> torch.Tensor:
    """One query token per sequence [B, H, d] attending to all its seq_len positions
    (only the last `window` of them with a window)."""
    out = torch.empty_like(query)
    for b, length in enumerate(seq_lens.tolist()):
        k, v = gather_kv(kv_cache, block_tables[b], length)
        visible = torch.arange(length, device=query.device)[None, :] > length - 1 - (window or length)
        out[b] = attend(query[b : b + 1], k, v, scale, visible, softcap)[0].to(query.dtype)
    return out


def paged_prefill_attention_ref(query: torch.Tensor, kv_cache: torch.Tensor,
                                cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor,
                                block_tables: torch.Tensor, scale: float,
                                max_query_len: int | None = None, window: int | None = None,
                                softcap: float | None = None) -> torch.Tensor:
    """Chunks of new tokens [Tq, H, d] packed by cu_seqlens_q, on top of cached positions.

    Token i of a chunk of q_len tokens sees positions [0, seq_len - q_len + i], and with a
    window only those > seq_len - q_len + i - window (transformers' sliding window).
    max_query_len is accepted for signature parity with the kernel and unused.
    """
    out = torch.empty_like(query)
    starts = cu_seqlens_q.tolist()
    for b, length in enumerate(seq_lens.tolist()):
        lo, hi = starts[b], starts[b + 1]
        context = length - (hi - lo)
        k, v = gather_kv(kv_cache, block_tables[b], length)
        rows = torch.arange(hi - lo, device=query.device)[:, None]
        cols = torch.arange(length, device=query.device)[None, :]
        visible = cols <= context + rows
        if window is not None:
            visible &= cols > context + rows - window
        out[lo:hi] = attend(query[lo:hi], k, v, scale, visible, softcap).to(query.dtype)
    return out
