"""A decoder read as a pooling model through its own paged forward: pagode's causal model
(engine/model/) runs each input as one prefill into a scratch paged cache that lives for the
forward only, and the last token's state is the embedding or, through the LM head, the yes/no
logits a Qwen3-Reranker-style model is scored by. The families whose layer the packed forward
(engine/pooling/packed_decoder.py) does not run (Gemma 2 and 3, OLMo 2, the MoE ones) take this
path, always in fp32 products (or on the blocks --quantization int8/int4 asks for)."""

from __future__ import annotations

import numpy as np
import torch

from engine.attention import AttentionBackend, AttentionMetadata
from engine.model.config import ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.runner.kv_cache import allocate_kv_cache

BLOCK = 16


class DecoderPooler:
    def __init__(self, model: LlamaForCausalLM, cfg: ModelConfig, backend: AttentionBackend,
                 dtype: torch.dtype) -> None:
        self.model = model
        self.cfg = cfg
        self.backend = backend
        self.dtype = dtype
        backend.prepare(cfg.num_attention_heads, dtype, allocate_kv_cache(cfg, 1, BLOCK, dtype, torch.device("cpu"))[0])

    @torch.inference_mode()
    def last_states(self, rows: list[list[int]]) -> torch.Tensor:
        """The final norm's output at each row's last token, [len(rows), hidden]. Rows of one
        token run first, as the decodes of a step do; the result keeps the callers' order."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]) != 1)
        ordered = [rows[i] for i in order]
        ids, positions, meta = pack(ordered)
        caches = allocate_kv_cache(self.cfg, int(meta.block_tables.max()) + 1, BLOCK, self.dtype, torch.device("cpu"))
        hidden = self.model(ids, positions, meta, caches)
        last = hidden[meta.query_start_loc[1:].long() - 1]
        out = torch.empty_like(last)
        out[torch.tensor(order)] = last
        return out.float()

    @torch.inference_mode()
    def yes_no_logits(self, rows: list[list[int]], yes: int, no: int) -> torch.Tensor:
        """[len(rows), 2]: the LM head's logits of `yes` and `no` after each row."""
        logits = self.model.compute_logits(self.last_states(rows).to(self.dtype))
        return logits[:, [yes, no]].float()


def pack(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The rows as one step of prefills from position 0, each in blocks of its own."""
    lengths = np.array([len(r) for r in rows], np.int64)
    starts = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    blocks = -(-lengths // BLOCK)
    first_block = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    tables = np.zeros((len(rows), int(blocks.max())), np.int32)
    for row, (first, count) in enumerate(zip(first_block, blocks, strict=True)):
        tables[row, :count] = np.arange(first, first + count)
    positions = np.concatenate([np.arange(n) for n in lengths])
    slots = np.repeat(first_block, lengths) * BLOCK + positions
    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(slots), query_start_loc=torch.from_numpy(starts.astype(np.int32)),
        seq_lens=torch.from_numpy(lengths.astype(np.int32)), block_tables=torch.from_numpy(tables),
        num_decodes=int(np.count_nonzero(lengths == 1)), max_query_len=int(lengths.max()),
        max_seq_len=int(lengths.max()), query_start_loc_cpu=starts.tolist(), seq_lens_cpu=lengths.tolist())
    ids = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    return ids, torch.from_numpy(positions), meta
