"""What a forward pass needs to know about where each token's K/V lives.

Cache layout, one tensor per layer: ``kv_cache[layer]`` has shape
``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (index 0 = K, 1 = V).
A token's slot is ``block_id * block_size + offset``.

Tokens of one step are packed: the ``num_decodes`` decode sequences come first,
one token each, then the prefill (or extend) chunks, varlen via ``query_start_loc``.

A "sequence" here is a row of attention, not always a request: on the CPU each position
of a drafted request is a decode row of its own, among the decodes, with its request's
block table and a length that ends at itself (ModelRunner.prepare). Attention per row is
then causal over the draft, computed as a decode's (and by the fused decode step, when
the step holds nothing else); the host lists below follow the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64; -1 = padding, not written
    query_start_loc: torch.Tensor  # [B + 1] int32, cu_seqlens of the new tokens
    seq_lens: torch.Tensor  # [B] int32, cached + new positions per sequence
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    num_decodes: int  # the first num_decodes sequences have exactly one new token
    max_query_len: int
    max_seq_len: int
    # Host copies, so CPU code can loop without device syncs.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_prefills(self) -> int:
        return self.num_seqs - self.num_decodes
