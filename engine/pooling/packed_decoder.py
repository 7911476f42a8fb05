"""A decoder read as a pooling model, its inputs run packed: one causal forward over the
batch's real tokens, and each input's last token's final state out (Qwen3-Embedding's
vector, or through the LM head the yes/no logits of a Qwen3-Reranker-style model).

Pooling keeps nothing after the forward, so no paged cache is needed: every linear layer,
norm and activation runs on the [T, hidden] stream of the batch's tokens, and each layer's
rotated keys and values are written in stream order into one buffer [2, T, 1, kv_heads,
head_dim] that the next layer overwrites. The attention backend reads it as a cache of
one-token blocks, each input's block table being its own token offsets, so its causal
prefill path (the C++ kernel, or torch's flash kernel where the load-time race picks it)
attends per input over the packed stream with nothing copied. Only the last tokens are
pooled, so the last layer attends, projects and runs its MLP for those rows alone.

`use_bf16` moves the layers' products onto the CPU's bf16 matrix units, as the encoders'
(engine/pooling/bf16_decoder.py), and keeps keys and values in bf16 so that attention takes
the kernel's bf16 body; the residual stream, every RMSNorm, RoPE and the final norm stay
fp32, and the stream is rounded to bf16 twice a layer (before the attention and before the
MLP). It is served so only where it holds the quality gate (engine/pooling/precision.py).

It runs the Llama-family layer (engine/model/llama.py: pre-norms, fused QKV, optional q/k
norms, SwiGLU) that Qwen3, Qwen2, Llama and Mistral share; a family with a layer of its
own shape keeps the paged forward (engine/pooling/decoder.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata
from engine.model.layers import RMSNorm
from engine.model.llama import MLP, Attention, DecoderLayer, LlamaForCausalLM
from engine.pooling import bf16_decoder
from engine.pooling.bf16_decoder import Swapped

# Tokens of the stream that a layer's per-token work takes at a time. On a whole 8,192-token
# batch every element-wise pass and each GEMM's output spill out of the core's cache: a
# bf16 <-> fp32 cast cost 6x more per token than on 512 rows, and a [T, 512] x [512, 3072]
# bf16 GEMM ran at 520 GFLOP/s against 1,200 (one AMX core).
SLICE = 512


def fits(model: nn.Module) -> bool:
    """Whether the model is built of the Llama-family layer exactly, the one this forward
    follows (a subclass may compute otherwise)."""
    return (type(model).forward is LlamaForCausalLM.forward and isinstance(model, LlamaForCausalLM)
            and all(type(layer) is DecoderLayer and type(layer.self_attn) is Attention and type(layer.mlp) is MLP
                    for layer in model.layers))


@dataclass
class Batch:
    """Where the batch's inputs lie in the packed stream, for every token's attention and
    for the last tokens' alone."""

    ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T] int64, each input from 0
    slots: torch.Tensor  # [T] int64: a token's K/V row is its place in the stream
    last: torch.Tensor  # [B]: each input's last token in the stream
    every: AttentionMetadata  # all T queries, causal within each input
    lasts: AttentionMetadata  # one query per input, its last token's, over the whole input


def pack(rows: list[list[int]]) -> Batch:
    lengths = np.array([len(r) for r in rows], np.int64)
    starts = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    width = int(lengths.max())
    offsets = np.arange(width)[None, :]
    # Each token is a block of one: an input's table lists its own rows (0 past its length).
    tables = torch.from_numpy(np.where(offsets < lengths[:, None], starts[:-1, None] + offsets, 0).astype(np.int32))
    seq_lens = torch.from_numpy(lengths.astype(np.int32))
    total = int(starts[-1])

    def meta(query_starts: np.ndarray, max_query: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=torch.arange(total), query_start_loc=torch.from_numpy(query_starts.astype(np.int32)),
            seq_lens=seq_lens, block_tables=tables, num_decodes=0, max_query_len=max_query, max_seq_len=width,
            query_start_loc_cpu=query_starts.tolist(), seq_lens_cpu=lengths.tolist())

    return Batch(ids=torch.tensor([t for r in rows for t in r], dtype=torch.long),
                 positions=torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])),
                 slots=torch.arange(total), last=torch.from_numpy(starts[1:] - 1),
                 every=meta(starts, width), lasts=meta(np.arange(len(rows) + 1), 1))


class PackedDecoder:
    """pagode's decoder, run over a batch's inputs packed, for their last tokens' states."""

    def __init__(self, model: LlamaForCausalLM, backend: AttentionBackend) -> None:
        assert fits(model)
        self.model = model
        self.backend = backend
        self.dtype = torch.float32  # what the layers' products compute in
        self.prepare()

    @property
    def kv_dtype(self) -> torch.dtype:
        """bf16 keys and values make the attention kernel take its bf16 products."""
        return self.dtype

    def prepare(self) -> None:
        """Let the backend race its attention paths for this shape and K/V dtype now, at load."""
        cfg = self.model.config
        self.backend.prepare(cfg.num_attention_heads, torch.float32, self.kv_buffer(1))

    def kv_buffer(self, tokens: int) -> torch.Tensor:
        cfg = self.model.config
        return torch.empty(2, tokens, 1, cfg.num_key_value_heads, cfg.head_dim, dtype=self.kv_dtype)

    @torch.inference_mode()
    def last_states(self, rows: list[list[int]]) -> torch.Tensor:
        """The final norm's output at each row's last token, [len(rows), hidden] fp32.

        Per layer, one attention call over the whole batch; everything per token runs a slice
        of the stream at a time, a layer's MLP and the next layer's QKV in the same slice."""
        batch = pack(rows)
        layers = [cast(DecoderLayer, layer) for layer in self.model.layers]
        total, cfg = batch.ids.shape[0], self.model.config
        kv = self.kv_buffer(total)
        stream = self.model.embed(batch.ids)  # the residual stream, [T, hidden] fp32, added to in place
        queries = torch.empty(total, cfg.num_attention_heads, cfg.head_dim)
        first = layers[0]
        for part in slices(total):
            queries[part] = self.project(first.self_attn, first.input_layernorm(stream[part])[0], batch, part, kv)
        for layer, following in itertools.pairwise(layers):
            out = self.attend(layer.self_attn, queries, kv, batch.every)
            for part in slices(total):
                h = add_norm(following.input_layernorm, self.finish(layer, out[part], stream[part]), stream[part])
                queries[part] = self.project(following.self_attn, h, batch, part, kv)
        last = layers[-1]
        out = self.attend(last.self_attn, queries[batch.last], kv, batch.lasts)
        residual = stream[batch.last]
        return self.model.norm(self.finish(last, out, residual), residual)[0]

    def project(self, attn: Attention, h: torch.Tensor, batch: Batch, part: slice, kv: torch.Tensor) -> torch.Tensor:
        """A slice's normed stream h -> its rotated queries [n, heads, head_dim] fp32; its
        rotated keys and values go to their rows of kv."""
        qkv = normalize_qk(attn, attn.qkv_proj(h.to(self.dtype)).float())
        return self.backend.rotate_and_write_kv(qkv, batch.positions[part], attn.rope.cos, attn.rope.sin, kv,
                                                batch.slots[part], attn.num_heads)

    def attend(self, attn: Attention, queries: torch.Tensor, kv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.backend.prefill(queries, kv, meta, attn.scale, window=attn.attn.window, softcap=attn.attn.softcap)

    def finish(self, layer: DecoderLayer, attended: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
        """The rest of the layer for a slice: its attention output [n, heads, head_dim] through
        o_proj into the stream's rows (added in place), then the MLP's output, not yet added."""
        attn = layer.self_attn
        out = layer.scale_residual(attn.o_proj(attended.reshape(-1, attn.q_size).to(self.dtype)).float())
        h = add_norm(layer.post_attention_layernorm, out, stream)
        return layer.scale_residual(layer.mlp(h.to(self.dtype)).float())

    @torch.inference_mode()
    def yes_no_logits(self, rows: list[list[int]], yes: int, no: int) -> torch.Tensor:
        """[len(rows), 2]: the LM head's logits of `yes` and `no` after each row."""
        return self.model.compute_logits(self.last_states(rows))[:, [yes, no]].float()

    # ---- precision ----

    @staticmethod
    def can_use_bf16() -> bool:
        return bf16_decoder.available()

    def use_bf16(self) -> Swapped:
        """The layers' products in bf16 (engine/pooling/bf16_decoder.py), keys and values too;
        what was replaced, for restore()."""
        swapped = bf16_decoder.swap_in(self.model)
        self.dtype = torch.bfloat16
        self.prepare()
        return swapped

    def restore(self, swapped: Swapped) -> None:
        """Undo use_bf16: the fp32 layers back in place."""
        bf16_decoder.swap_back(self.model, swapped)
        self.dtype = torch.float32
        self.prepare()


def slices(total: int) -> list[slice]:
    return [slice(start, min(start + SLICE, total)) for start in range(0, total, SLICE)]


def add_norm(norm: RMSNorm, out: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """norm(stream + out), the stream's rows (a view) left holding stream + out."""
    h, total = norm(out, stream)
    if total.data_ptr() != stream.data_ptr():  # the torch path returns the sum; the kernel adds in place
        stream.copy_(total)
    return h


def normalize_qk(attn: Attention, qkv: torch.Tensor) -> torch.Tensor:
    """qkv [T, (heads + 2 kv_heads) head_dim] fp32 with the queries and keys RMS-normalized as
    transformers does (Qwen3), in place where the model's C++ norm takes it."""
    q_norm, k_norm = attn.q_norm, attn.k_norm
    return qkv if q_norm is None or k_norm is None else attn.normalize_qk(qkv, q_norm, k_norm)
