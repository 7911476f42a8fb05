"""Attention through the Triton kernels of cuda_kernels: the paged cache is read in place.

On CUDA the kernels are compiled. Without CUDA they run only under Triton's interpreter (slow,
for tests), which the caller chooses by setting TRITON_INTERPRET=1 before the kernels are first
used: the engine never changes a process's environment on its own.
"""

from __future__ import annotations

import os

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata


def require_cuda_or_interpreter() -> None:
    """Refuse at construction what would fail at the first step: compiled kernels need CUDA."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return
    raise ValueError("the triton attention backend needs a CUDA device; on a CPU use the cpu backend, "
                     "or start with TRITON_INTERPRET=1 to run the kernels under Triton's interpreter (slow)")


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, decode_num_splits: int | None = None) -> None:
        require_cuda_or_interpreter()
        # Import after the interpreter choice: it is fixed when the kernels are decorated.
        from cuda_kernels.cache_write import reshape_and_cache
        from cuda_kernels.decode_attention import paged_decode_attention
        from cuda_kernels.prefill_attention import paged_prefill_attention

        self._write = reshape_and_cache
        self._decode = paged_decode_attention
        self._prefill = paged_prefill_attention
        # None: derived from meta.max_seq_len per call (a host int, so no device sync).
        # Under CUDA graphs the value seen at capture is baked in, and stays correct for
        # any seq_lens because the kernel divides each sequence among splits itself.
        self.decode_num_splits = decode_num_splits

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        self._write(key, value, kv_cache, slot_mapping)

    def decode(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
               scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        nd = meta.num_decodes
        return self._decode(query, kv_cache, meta.block_tables[:nd], meta.seq_lens[:nd], scale,
                            num_splits=self.decode_num_splits, max_seq_len=meta.max_seq_len,
                            window=window, softcap=softcap)

    def prefill(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, *, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        nd = meta.num_decodes
        # Decodes come first with one token each, so the prefill chunks start at token nd.
        cu_seqlens = meta.query_start_loc[nd:] - nd
        return self._prefill(query, kv_cache, cu_seqlens, meta.seq_lens[nd:],
                             meta.block_tables[nd:], scale, meta.max_query_len, window=window,
                             softcap=softcap)
