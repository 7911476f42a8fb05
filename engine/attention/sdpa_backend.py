"""Attention in pure torch, never C++: `--attention-backend sdpa`, and the reference.

It never copies the whole cache, which may be stored in fp16/bf16 (converted as read) or
int8 (dequantized as read, quantized as written: kv_int8.py).
Decodes are one padded matmul over a gather of only the batch's blocks; each prefill
chunk is one scaled_dot_product_attention call. The cpu backend (cpu_backend.py) is
this one with the C++ kernels where they apply.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention import kv_int8
from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata


class SdpaAttentionBackend(AttentionBackend):
    name = "sdpa"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        _, num_blocks, block_size, kv_heads, width = kv_cache.shape
        flat = kv_cache.view(2, num_blocks * block_size, kv_heads, width)
        flat[0].index_copy_(0, slot_mapping, kv_int8.store(key, kv_cache.dtype))
        flat[1].index_copy_(0, slot_mapping, kv_int8.store(value, kv_cache.dtype))

    def decode(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        return self.decode_gathered(query, kv_cache, meta, scale, window=window, softcap=softcap)

    def decode_gathered(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                        scale: float, *, window: int | None = None,
                        softcap: float | None = None) -> torch.Tensor:
        """Pure torch: gather the batch's blocks, then one padded batched matmul."""
        nd = meta.num_decodes
        block_size, kv_heads = kv_cache.shape[2:4]
        head_dim = kv_int8.head_dim(kv_cache)
        max_len = max(meta.seq_lens_cpu[:nd])
        nb = -(-max_len // block_size)
        tables = meta.block_tables[:nd, :nb]
        # [2, B, nb, bs, kvh, d] -> K/V [B, kvh, L, d]
        kv = kv_int8.widen(kv_cache[:, tables], query.dtype)
        kv = kv.view(2, nd, nb * block_size, kv_heads, head_dim).transpose(2, 3)
        group = query.shape[1] // kv_heads
        q = query.view(nd, kv_heads, group, head_dim)
        scores = soft_cap(torch.matmul(q, kv[0].transpose(-1, -2)) * scale, softcap)  # [B, kvh, g, L]
        positions = torch.arange(nb * block_size, device=query.device)
        pad = positions[None, :] >= meta.seq_lens[:nd, None]
        if window is not None:
            pad |= positions[None, :] <= meta.seq_lens[:nd, None] - 1 - window
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        return torch.matmul(probs, kv[1]).view(nd, kv_heads * group, head_dim)

    def prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        nd = meta.num_decodes
        starts = meta.query_start_loc_cpu
        base = starts[nd]
        out = torch.empty_like(query)
        for i in range(nd, meta.num_seqs):
            lo, hi = starts[i] - base, starts[i + 1] - base
            out[lo:hi] = self._prefill_one(query[lo:hi], kv_cache, meta, i, scale, window, softcap)
        return out

    def _prefill_one(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                     i: int, scale: float, window: int | None, softcap: float | None) -> torch.Tensor:
        block_size, kv_heads = kv_cache.shape[2:4]
        head_dim = kv_int8.head_dim(kv_cache)
        seq_len, q_len = meta.seq_lens_cpu[i], q.shape[0]
        nb = -(-seq_len // block_size)
        kv = kv_int8.widen(kv_cache[:, meta.block_tables[i, :nb]], q.dtype)
        kv = kv.view(2, nb * block_size, kv_heads, head_dim)
        k, v = kv[0, :seq_len].transpose(0, 1), kv[1, :seq_len].transpose(0, 1)  # [kvh, L, d]
        qh = q.transpose(0, 1)  # [H, q_len, d]
        group = q.shape[1] // kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=0)
            v = v.repeat_interleave(group, dim=0)
        if window is not None or softcap is not None:
            return attend_masked(qh, k, v, seq_len - q_len, scale, window, softcap).transpose(0, 1)
        return self.attend_causal(qh, k, v, seq_len - q_len, scale).transpose(0, 1)

    def attend_causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int,
                      scale: float) -> torch.Tensor:
        """q [H, n, d] at positions context.. against k, v [H, context + n, d], causally."""
        if context == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        n, seq_len = q.shape[1], k.shape[1]
        rows = torch.arange(n, device=q.device)[:, None] + context
        mask = torch.arange(seq_len, device=q.device)[None, :] <= rows
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def soft_cap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Gemma 2's logit soft-cap on scaled scores, as transformers computes it; None: as is."""
    if softcap is None:
        return scores
    return torch.tanh(scores / softcap) * softcap


def attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float,
                  window: int | None, softcap: float | None) -> torch.Tensor:
    """Causal attention with a sliding window and/or a soft-cap, on the full score matrix.

    q [H, n, d] at positions context.. against k, v [H, context + n, d]. SDPA has no
    soft-cap, so the scores are explicit here: scale, cap, mask, then an fp32 softmax.
    """
    n, seq_len = q.shape[1], k.shape[1]
    rows = torch.arange(n, device=q.device)[:, None] + context
    cols = torch.arange(seq_len, device=q.device)[None, :]
    visible = cols <= rows
    if window is not None:
        visible &= cols > rows - window
    scores = soft_cap(torch.matmul(q, k.transpose(-1, -2)) * scale, softcap)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)
