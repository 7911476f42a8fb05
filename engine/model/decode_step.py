"""A whole decode step of a block-quantized Llama in one C++ call, on the CPU.

Why: with one to a few tokens per step, a layer's ten or so ops each take microseconds,
and dispatching ~300 of them per step from Python (module calls, ctypes, allocations)
cost about as much as the arithmetic. `cpu_kernels/src/decode_step.cpp` runs every
layer back to back on preallocated scratch, calling the very C++ functions that the
layer-by-layer path calls one at a time (one library), so both give the same numbers.
This module fills the C++ step's pointer table from a model and decides when it applies;
the model runner owns the step and calls it instead of the model.

It applies to a step of decodes only (a drafted sequence's positions included: the runner
lays each out as a decode row of its own, so the step verifies drafts too), on a model
whose projections are all block-quantized QuantLinear and whose K/V cache the attention
backend reads with the same C++ kernel
(AttentionBackend.supports_fused_cpu_step), up to a number of decodes measured at load:
both paths run synthetic decode steps of 1, 2, 4, ... tokens, and the
fused step keeps every count up to its last win before the layer-by-layer path (whose big
projections move to their dense GEMM) wins twice in a row (engine/autotune.py; the
start-up log prints the timings). Anything else runs layer by layer. PAGODE_DECODE_STEP=0
turns it off; EngineConfig.fused_decode_limit (`--fused-decode-limit N`) pins the limit.
"""

from __future__ import annotations

import logging
import struct
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from cpu_kernels.decode_step_kernel import CACHE_TYPES, PROJECTIONS, DecodeStepKernel
from cpu_kernels.quant_linear import part_table
from engine import autotune, envs, native, race_memory
from engine.attention import AttentionBackend, AttentionMetadata
from engine.autotune import Crossover
from engine.model.config import ModelConfig
from engine.model.llama import Attention, DecoderLayer, LlamaForCausalLM
from engine.quant.linear import QuantLinear

log = logging.getLogger("pagode")


class FusedDecodeStep(nn.Module):
    """The C++ step over one model and its K/V caches; holds pointers, not tensors of its own."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[torch.Tensor], kernel: DecodeStepKernel) -> None:
        super().__init__()
        cfg = model.config
        self.kernel = kernel
        slots = kernel.slots()
        layers = decoder_layers(model)
        self.table = torch.zeros(len(layers), slots, dtype=torch.int64)
        self.parts: list[torch.Tensor] = []  # each projection's part table, which the pointers point into
        for i, (layer, cache) in enumerate(zip(layers, kv_caches, strict=True)):
            row = [layer.input_layernorm.weight.data_ptr(), layer.post_attention_layernorm.weight.data_ptr(),
                   cache[0].data_ptr(), cache[1].data_ptr(), *attention_slots(layer.self_attn)]
            for name in PROJECTIONS:
                proj = layer.get_submodule(name)
                assert isinstance(proj, QuantLinear) and proj.blocks is not None
                self.parts.append(part_table(proj.blocks, proj.bias))
                row += [self.parts[-1].data_ptr(), self.parts[-1].shape[0]]
            self.table[i] = torch.tensor(row, dtype=torch.int64)
        self.max_tokens = 0  # set by measure_limit
        self.dims = torch.tensor([cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                  cfg.intermediate_size, kv_caches[0].shape[2]], dtype=torch.int64)
        self.cache_type = CACHE_TYPES[kv_caches[0].dtype]
        self.final_norm = model.norm.weight.detach()
        self.eps = model.norm.eps
        self.scale = cfg.attention_scale
        self.embedding = model.embed_tokens.weight.detach()

    def applies(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        return num_tokens == meta.num_decodes == meta.num_seqs and num_tokens <= self.max_tokens

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The final-norm hidden states [B, hidden] of a decode-only step (K/V written)."""
        hidden = F.embedding(input_ids, self.embedding).contiguous()
        tables = meta.block_tables.to(torch.int32).contiguous()
        lens = meta.seq_lens.to(torch.int32).contiguous()
        positions = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        self.kernel.run(hidden, self.table, self.dims, self.cache_type, self.final_norm, self.eps,
                        self.scale, positions, slots, tables, lens)
        return hidden


def attention_slots(attn: Attention) -> list[int]:
    """The per-layer slots of what a family adds to the attention: per-head q/k norm weights
    (unsupported() refuses norms over the whole projection), the layer's RoPE tables, its
    window and soft-cap (as float32 bits)."""
    q_norm = 0 if attn.q_norm is None else attn.q_norm.weight.data_ptr()
    k_norm = 0 if attn.k_norm is None else attn.k_norm.weight.data_ptr()
    softcap = attn.attn.softcap or 0.0
    return [q_norm, k_norm, attn.rope.cos.data_ptr(), attn.rope.sin.data_ptr(), attn.attn.window or 0,
            struct.unpack("<i", struct.pack("<f", softcap))[0]]


def decoder_layers(model: LlamaForCausalLM) -> list[DecoderLayer]:
    return [cast(DecoderLayer, layer) for layer in model.layers]


def unsupported(model: LlamaForCausalLM, kv_caches: list[torch.Tensor], backend: AttentionBackend) -> str | None:
    """Why the fused step cannot run this model with this backend, or None when it can."""
    if not envs.DECODE_STEP.get():
        return "PAGODE_DECODE_STEP=0"
    if kv_caches[0].device.type != "cpu" or model.embed_tokens.weight.dtype != torch.float32:
        return "not an fp32 model on the CPU"
    why = layer_shape_unsupported(model.config)
    if why:
        return why
    if any(type(layer) is not DecoderLayer for layer in model.layers):
        return f"{model.config.architecture}: its layers are not Llama's (norms, activation)"
    if not backend.supports_fused_cpu_step(kv_caches[0]):
        return f"the {backend.name} attention backend does not read this cache with the C++ kernel"
    for layer in model.layers:
        for name in PROJECTIONS:
            proj = layer.get_submodule(name)
            if not isinstance(proj, QuantLinear) or proj.blocks is None:
                return "not every projection is block-quantized"
    return None


def layer_shape_unsupported(cfg: ModelConfig) -> str | None:
    """Why the C++ step, which computes plain Llama layers, cannot compute this family's."""
    if cfg.num_experts:
        return f"{cfg.architecture}: mixture-of-experts layers (the C++ step computes one dense MLP)"
    if cfg.post_norms_only:
        return f"{cfg.architecture}: norms after attention and MLP"
    if cfg.qk_norm not in (None, "head"):
        return f"{cfg.architecture}: RMSNorm over the whole q and k projections"
    if cfg.rotary_dim != cfg.head_dim:
        return f"{cfg.architecture}: partial rotary"
    if (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scaling) != (1.0, 1.0, 1.0) \
            or cfg.attention_multiplier is not None:
        return f"{cfg.architecture}: embedding/residual/attention/logits multipliers"
    return None


def build(model: LlamaForCausalLM, kv_caches: list[torch.Tensor], backend: AttentionBackend, max_decodes: int,
          pinned_limit: int | None = None) -> FusedDecodeStep | None:
    """The fused decode step for this model, or None (layer by layer) with the reason logged.

    `pinned_limit` (EngineConfig.fused_decode_limit) replaces the measured limit."""
    why = "a fused-decode limit of 0" if pinned_limit == 0 else unsupported(model, kv_caches, backend)
    kernel = None if why else native.decode_step()
    if kernel is None:
        log.info("decode steps run layer by layer (%s)", why or "the C++ step is not built here")
        return None
    step = FusedDecodeStep(model, kv_caches, kernel)
    crossover = (Crossover(pinned_limit) if pinned_limit is not None
                 else measure_limit(step, model, kv_caches, max_decodes))
    step.max_tokens = crossover.max_kernel_tokens
    log.info("decode steps of up to %d decodes run as one C++ call (ms fused / layer by layer: %s)",
             step.max_tokens, crossover.timings_ms)
    return step


_limits: dict[tuple[int, ...], Crossover] = {}


def measure_limit(step: FusedDecodeStep, model: LlamaForCausalLM, kv_caches: list[torch.Tensor],
                  max_decodes: int) -> Crossover:
    """Race both paths on decode steps of 1, 2, 4, ... sequences, on the engine's threads;
    cached per model shape, and read back at later starts on the same machine
    (engine/race_memory.py).

    Each synthetic sequence holds one block of the (still empty) cache, so the K/V written
    here is overwritten before any request reads it.
    """
    block_size, num_blocks = kv_caches[0].shape[2], kv_caches[0].shape[1]
    key = (*step.dims.tolist(), step.cache_type, len(kv_caches), max_decodes)
    if key in _limits:
        return _limits[key]
    kept = race_memory.recall("fused-decode-step", ":".join(map(str, key)))
    if kept is not None:
        _limits[key] = Crossover(int(kept["limit"]), {int(m): (t[0], t[1]) for m, t in kept["ms"].items()})
        return _limits[key]
    counts = [m for m in autotune.COUNTS if m <= min(max_decodes, num_blocks)]

    def time_both(m: int) -> tuple[float, float]:
        ids, positions, meta = synthetic_decodes(m, block_size, step.embedding.shape[0])
        return (autotune.best_time(lambda: step(ids, positions, meta), 3),
                autotune.best_time(lambda: model(ids, positions, meta, kv_caches), 3))

    result = autotune.crossover(counts, time_both, digits=2, threads=None)
    race_memory.keep("fused-decode-step", ":".join(map(str, key)),
                     {"limit": result.max_kernel_tokens, "ms": result.timings_ms})
    _limits[key] = result
    return result


def synthetic_decodes(m: int, block_size: int, vocab: int, context: int | None = None,
                      num_blocks: int | None = None) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """m decodes, each at the last of `context` positions (default: one block) in a run of
    cache blocks of its own; past `num_blocks` the runs wrap around and share blocks."""
    context = context or block_size
    per_seq = -(-context // block_size)
    tables = torch.arange(m * per_seq, dtype=torch.int32).reshape(m, per_seq)
    if num_blocks is not None:
        tables %= num_blocks
    last = context - 1
    slots = tables[:, last // block_size].to(torch.int64) * block_size + last % block_size
    meta = AttentionMetadata(
        slot_mapping=slots, query_start_loc=torch.arange(m + 1, dtype=torch.int32),
        seq_lens=torch.full((m,), context, dtype=torch.int32), block_tables=tables, num_decodes=m,
        max_query_len=1, max_seq_len=context, query_start_loc_cpu=list(range(m + 1)), seq_lens_cpu=[context] * m)
    ids = torch.randint(0, vocab, (m,), dtype=torch.int64)
    return ids, torch.full((m,), last, dtype=torch.int64), meta
