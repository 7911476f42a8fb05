"""Small building blocks: RMSNorm, rotary embedding (+ K/V cache write), SwiGLU, paged attention.

Each is a module, so a profiler can time them by class with forward hooks. On the
CPU the element-wise ones run as fused C++ kernels (engine/model/fused_ops.py); RoPE +
the K/V write and attention are the attention backend's (engine/attention), which may
run them in C++ too. The model never calls a C++ kernel directly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine import native
from engine.attention import AttentionBackend, AttentionMetadata
from engine.attention.rope import apply_rope
from engine.model import fused_ops
from engine.model.rope_scaling import inv_freq_and_factor


class RMSNorm(nn.Module):
    """residual-add + RMSNorm: returns (norm(residual + x), residual + x).

    With residual None it is a plain RMSNorm and the residual stream starts at x.
    Same arithmetic as HF's LlamaRMSNorm, so greedy outputs match token for token.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.kernel = native.fused_ops()  # None: torch ops

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_ops.add_rms_norm(x, residual, self.weight, self.eps, self.kernel)

    def kernel_weight(self) -> torch.Tensor:
        """What the C++ norm multiplies by (the fused decode step reads it too)."""
        return self.weight.detach()


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = native.fused_ops()  # None: torch ops

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return fused_ops.silu_and_mul(gate_up, self.kernel)


class RotaryEmbedding(nn.Module):
    """Non-interleaved (rotate-half) RoPE with a precomputed cos/sin table [positions, head_dim/2].

    Partial rotary (rotary_dim < head_dim) fills the table's last columns with cos 1 and
    sin 0, which leave those dimensions as they are; the model reorders each head's Q/K rows
    so that the rotated pairs sit where rotate-half pairs them (LlamaForCausalLM.finish_loading).
    `identity` makes the table of a layer without RoPE (smollm3's NoPE layers), so every
    layer runs the same fused rotate-and-write kernel.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None = None, rotary_dim: int | None = None,
                 max_position_embeddings: int | None = None, identity: bool = False) -> None:
        super().__init__()
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.args = (head_dim, max_positions, theta, scaling, rotary_dim or head_dim,
                     max_position_embeddings or max_positions, identity)
        # On the meta device the table is rebuilt after materializing anyway, and torch's
        # meta kernels for its arithmetic import torch._dynamo: seconds of start-up for nothing.
        if torch.get_default_device().type != "meta":
            self.build()

    def build(self) -> None:
        """(Re)compute the cos/sin table; needed after materializing from the meta device."""
        head_dim, max_positions, theta, scaling, rotary_dim, max_pos_emb, identity = self.args
        if identity:
            rotary_dim = 0
            inv_freq, factor = torch.empty(0), 1.0
        else:
            inv_freq, factor = inv_freq_and_factor(rotary_dim, theta, scaling, max_positions, max_pos_emb)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        cos, sin = freqs.cos(), freqs.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        rest = (head_dim - rotary_dim) // 2
        self.cos = torch.cat([cos, torch.ones(max_positions, rest)], dim=1)
        self.sin = torch.cat([sin, torch.zeros(max_positions, rest)], dim=1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rope(positions, q, k, self.cos, self.sin)


def rotate_half_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Where each of a head's dims comes from so that partial rotary becomes full rotate-half.

    transformers rotates dims [0, r) pairing i with i + r/2 and passes [r, d) through;
    rotate-half over the whole head pairs i with i + d/2. Putting the rotated halves at
    [0, r/2) and [d/2, d/2 + r/2) and the passed dims in the gaps gives the same q.k for
    every pair of positions, since Q and K move alike and V does not move."""
    half, rhalf = head_dim // 2, rotary_dim // 2
    passed = list(range(rotary_dim, head_dim))
    gap = half - rhalf
    first = list(range(rhalf)) + passed[:gap]
    second = list(range(rhalf, rotary_dim)) + passed[gap:]
    return torch.tensor(first + second, dtype=torch.int64)


class RotaryCacheWrite(nn.Module):
    """RoPE on a step's queries and keys, and the K/V cache write, in one pass.

    Takes the fused QKV projection output and returns the rotated queries
    [T, heads, head_dim]; keys and values land in their cache slots. The backend does
    both (AttentionBackend.rotate_and_write_kv), fused where it can.
    """

    def __init__(self, rope: RotaryEmbedding, backend: AttentionBackend, num_heads: int) -> None:
        super().__init__()
        self.rope = rope
        self.backend = backend
        self.num_heads = num_heads

    def forward(self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        return self.backend.rotate_and_write_kv(qkv, positions, self.rope.cos, self.rope.sin, kv_cache,
                                                meta.slot_mapping, self.num_heads)


class PagedAttention(nn.Module):
    """Attention of the step's queries over the paged cache (already written).

    window: a sliding-window layer's window (Mistral, Gemma's local layers); softcap:
    Gemma 2's attention logit soft-cap. None: full attention, no cap.
    """

    def __init__(self, backend: AttentionBackend, scale: float, window: int | None = None,
                 softcap: float | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.scale = scale
        self.window = window
        self.softcap = softcap

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.backend.attend(query, kv_cache, meta, self.scale, window=self.window, softcap=self.softcap)


def kv_window(model: nn.Module) -> int | None:
    """The sliding window every attention layer of the model has (the widest), or None when
    any layer attends fully: only then may a sequence's old KV blocks be freed."""
    windows = [m.window for m in model.modules() if isinstance(m, PagedAttention)]
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)
