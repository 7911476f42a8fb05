"""Attention through the Triton kernels of cuda_kernels: the paged cache is read in place.

On CUDA the kernels are compiled; on a machine without CUDA they run under Triton's
interpreter (slow, for tests), which must be chosen before the kernels are defined.
"""

from __future__ import annotations

import logging
import os

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata

logger = logging.getLogger(__name__)


def enable_interpreter_without_cuda() -> None:
    """Without CUDA the interpreter is Triton's only way to run; pick it before decoration."""
    if torch.cuda.is_available() or "TRITON_INTERPRET" in os.environ:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    logger.warning("no CUDA device: running the Triton attention kernels under the "
                   "interpreter (TRITON_INTERPRET=1), which is slow and meant for tests")


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def __init__(self, decode_num_splits: int | None = None) -> None:
        enable_interpreter_without_cuda()
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
