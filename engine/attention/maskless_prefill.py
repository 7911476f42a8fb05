"""Causal prefill and extend attention on the CPU without an explicit mask.

A chunk of n queries at positions context.. sees every cached key before it and the
chunk's own keys causally. SDPA with a boolean mask falls back to torch's math path,
which builds the whole [n, context + n] score matrix and then masks it, and a long prefill
spends most of its attention time there (docs/speed.md). Instead the chunk is cut into tiles of
TILE queries; each tile attends to the keys before it with no mask and to its own
diagonal block with is_causal (square, so torch's top-left alignment is the right one),
both through torch's CPU flash kernel, which also returns each row's log-sum-exp; the two
partial outputs are merged by those weights. The masked-out upper triangle is never
computed, beyond half of each diagonal block.
"""

from __future__ import annotations

import torch

TILE = 128  # queries per tile (the tile size barely matters in 64-256: docs/speed.md)

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float) -> torch.Tensor:
    """q [H, n, d] at positions context..context+n-1 against k, v [H, context + n, d]."""
    q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    n = q.shape[2]
    out = torch.empty_like(q)
    for lo in range(0, n, TILE):
        hi = min(n, lo + TILE)
        start = context + lo
        own, own_lse = _flash(q[:, :, lo:hi], k[:, :, start:context + hi], v[:, :, start:context + hi],
                              0.0, True, scale=scale)
        if start == 0:
            out[:, :, lo:hi] = own
            continue
        before, before_lse = _flash(q[:, :, lo:hi], k[:, :, :start], v[:, :, :start], 0.0, False, scale=scale)
        weight = torch.sigmoid(before_lse - own_lse).unsqueeze(-1).to(q.dtype)  # e^a / (e^a + e^b)
        out[:, :, lo:hi] = torch.lerp(own, before, weight)
    return out[0]


def supported(q: torch.Tensor) -> bool:
    """torch's CPU flash kernel takes fp32, bf16 and fp16 on the CPU."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16)
