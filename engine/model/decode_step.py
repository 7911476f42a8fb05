"""A whole decode step of a block-quantized decoder in one C++ call, on the CPU.

Why: with one to a few tokens per step, a layer's ten or so ops each take microseconds,
and dispatching ~300 of them per step from Python (module calls, ctypes, allocations)
cost about as much as the arithmetic. `cpu_kernels/src/decode_step.cpp` runs every
layer back to back on preallocated scratch, calling the very C++ functions that the
layer-by-layer path calls one at a time (one library), so both give the same numbers.
This module fills the C++ step's pointer table from a model and decides when it applies;
the model runner owns the step and calls it instead of the model. Every dense family's
layers fit the table (norms before and/or after each sublayer, q/k norms, per-layer RoPE,
windows, soft-caps, Granite's multipliers, SiLU or tanh-GELU); the embedding (and its scale)
and the lm_head stay the model's, in Python. Mixture-of-experts layers run layer by layer.

It applies to a step of decodes only (a drafted sequence's positions included: the runner
lays each out as a decode row of its own, so the step verifies drafts too), on a model
whose projections are all block-quantized QuantLinear and whose K/V cache the attention
backend reads with the same C++ kernel
(AttentionBackend.supports_fused_cpu_step), up to a number of decodes measured at load:
both paths run synthetic decode steps of 1, 2, 4, ... 64 tokens, and the
fused step keeps every count up to its last win before the layer-by-layer path wins twice in
a row (engine/tuning/fused_step.py; the start-up log prints the timings). Past a projection's
crossover, where the layer-by-layer path runs pagode's bf16 GEMM on the dense copy, the C++
step calls that same kernel on that copy (dense_slot), so the two paths compute alike at
every size and the fused step keeps steps of tens of decodes too. Anything else runs layer by
layer. PAGODE_DECODE_STEP=0 turns it off; EngineConfig.fused_decode_limit
(`--fused-decode-limit N`) pins the limit.
"""

from __future__ import annotations

import logging
import struct
from typing import cast

import torch
from torch import nn

from cpu_kernels.decode_step_kernel import ACTIVATIONS, CACHE_TYPES, PROJECTIONS, DecodeStepKernel
from cpu_kernels.quant_linear import part_table
from engine import envs, native
from engine.attention import AttentionBackend, AttentionMetadata
from engine.model.layers import RMSNorm
from engine.model.llama import Attention, LlamaForCausalLM, SublayerNorms
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.linear import QuantLinear
from engine.tuning import fused_step, timing
from engine.tuning.timing import Crossover

log = logging.getLogger("pagode")

# The fewest decodes the fused step runs on a dense copy. Up to 8 tokens the exact tile body
# takes every token's two bf16 halves in one operand, one product per block, and the whole
# step stays a read of the blocks, which the step's own race won; past 8 it needs a second
# operand per block, where the dense copy wins. (A layer's crossover, raced on one thread with
# its weight in cache, can hand even one token to the GEMM; docs/kernels.md has what a one-token
# fused step on the dense copies cost.)
DENSE_FROM = 9


class FusedDecodeStep(nn.Module):
    """The C++ step over one model and its K/V caches; holds pointers, and the few tensors
    made for it (part tables, Gemma's 1 + w norm weights) that they point into."""

    def __init__(self, model: LlamaForCausalLM, kv_caches: list[torch.Tensor], kernel: DecodeStepKernel) -> None:
        super().__init__()
        cfg = model.config
        self.kernel = kernel
        self.kept: list[torch.Tensor] = []  # what the table points into and nothing else holds
        out_scale = 0 if cfg.residual_multiplier == 1.0 else float_bits(cfg.residual_multiplier)
        rows: list[list[int]] = []
        dense_columns: list[int] = []  # where each projection's dense slot lies in a row
        # Each layer's projections in the table's order: where adapters' deltas are looked up.
        self.projections: list[list[nn.Module]] = []
        for layer, cache in zip(model.layers, kv_caches, strict=True):
            row = [*map(self.norm_slot, sublayer_norms(layer)), cache[0].data_ptr(), cache[1].data_ptr(),
                   *self.attention_slots(cast(Attention, layer.get_submodule("self_attn"))), out_scale,
                   ACTIVATIONS[str(activation(layer))]]
            projections = [layer.get_submodule(name) for name in PROJECTIONS]
            for proj in projections:
                assert isinstance(proj, QuantLinear) and proj.blocks is not None
                if not rows:
                    dense_columns.append(len(row) + 2)
                row += [self.keep(part_table(proj.blocks, proj.bias)), len(self.kept[-1]), self.dense_slot(proj)]
            self.projections.append(projections)
            assert len(row) == kernel.slots(), (len(row), kernel.slots())
            rows.append(row)
        self.table = torch.tensor(rows, dtype=torch.int64)
        # The same table with no dense copies, for steps while the layers are pinned on the
        # block kernel (pinned_path), which the layer-by-layer path then computes on the blocks.
        self.blocks_table = self.table.clone()
        self.blocks_table[:, dense_columns] = 0
        self.max_tokens = 0  # set by measure_limit
        self.dims = torch.tensor([cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                  cfg.intermediate_size, kv_caches[0].shape[2]], dtype=torch.int64)
        self.cache_type = CACHE_TYPES[kv_caches[0].dtype]
        self.final_norm = model.norm.kernel_weight()
        self.eps = model.norm.eps
        self.scale = cfg.attention_scale
        self.embedding = model.embed_tokens.weight.detach()
        self.embed = model.embed  # the family's embedding scale (Gemma's sqrt(hidden), Granite's multiplier)

    def keep(self, tensor: torch.Tensor) -> int:
        self.kept.append(tensor)
        return tensor.data_ptr()

    def dense_slot(self, proj: QuantLinear) -> int:
        """The projection's dense bf16 copy and the step sizes at which the layer-by-layer path
        runs pagode's bf16 GEMM on it (past the block kernel's crossover, up to the bf16
        kernel's own limit), so that the fused step computes those sizes as that path does; 0
        where the layer keeps no such copy (its steps stay on the blocks)."""
        steps = proj.amx_gemm_steps()
        if steps is None:
            return 0
        gemm = proj.gemm
        assert isinstance(gemm, Bf16Gemm)
        bias = 0 if gemm.bias_f32 is None else self.keep(gemm.bias_f32)
        first, last = max(steps[0], DENSE_FROM), steps[1]
        return self.keep(torch.tensor([self.keep(gemm.weight), bias, first, last], dtype=torch.int64))

    def norm_slot(self, norm: RMSNorm | None) -> int:
        return 0 if norm is None else self.keep(norm.kernel_weight().contiguous())

    def attention_slots(self, attn: Attention) -> list[int]:
        """The per-layer slots of what a family adds to the attention: q/k norm weights and
        whether they span the whole projections, the layer's RoPE tables, its window and
        soft-cap (as float32 bits)."""
        whole = attn.q_norm is not None and attn.q_norm.weight.numel() == attn.q_size
        softcap = attn.attn.softcap
        return [self.norm_slot(attn.q_norm), self.norm_slot(attn.k_norm), int(whole), attn.rope.cos.data_ptr(),
                attn.rope.sin.data_ptr(), attn.attn.window or 0, 0 if softcap is None else float_bits(softcap)]

    def applies(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        return (num_tokens == meta.num_decodes == meta.num_seqs and num_tokens <= self.max_tokens
                and self.pinned() in (None, "kernel"))

    def pinned(self) -> str | None:
        """The path pinned_path holds every projection on, None when they follow their crossovers."""
        first = self.projections[0][0]
        assert isinstance(first, QuantLinear)
        return first.pinned

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                adapters: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """The final-norm hidden states [B, hidden] of a decode-only step (K/V written).
        adapters: the projections' adapter tables [L, 4] (LoraRegistry.kernel_tables) and each
        row's adapter slot, when rows run on adapters."""
        hidden = self.embed(input_ids).contiguous()
        tables = meta.block_tables.to(torch.int32).contiguous()
        lens = meta.seq_lens.to(torch.int32).contiguous()
        positions = positions.to(torch.int64).contiguous()
        slots = meta.slot_mapping.to(torch.int64).contiguous()
        lora, row_slots = adapters if adapters is not None else (None, None)
        table = self.blocks_table if self.pinned() == "kernel" else self.table
        self.kernel.run(hidden, table, self.dims, self.cache_type, self.final_norm, self.eps,
                        self.scale, positions, slots, tables, lens, lora, row_slots)
        return hidden


def float_bits(value: float) -> int:
    """A float32 as the int64 slot the C++ side reads it back from."""
    return int(struct.unpack("<i", struct.pack("<f", value))[0])


def sublayer_norms(layer: nn.Module) -> SublayerNorms:
    method = getattr(layer, "sublayer_norms", None)
    assert method is not None, f"{type(layer).__name__} does not say where its norms are"
    return cast(SublayerNorms, method())


def activation(layer: nn.Module) -> str | None:
    """The gate function of the layer's MLP (MLP.activation), None for an MLP that names none."""
    return getattr(layer.get_submodule("mlp"), "activation", None)


def unsupported(model: LlamaForCausalLM, kv_caches: list[torch.Tensor], backend: AttentionBackend) -> str | None:
    """Why the fused step cannot run this model with this backend, or None when it can."""
    if not envs.DECODE_STEP.get():
        return "PAGODE_DECODE_STEP=0"
    if kv_caches[0].device.type != "cpu" or model.embed_tokens.weight.dtype != torch.float32:
        return "not an fp32 model on the CPU"
    why = layer_unsupported(model)
    if why:
        return why
    if not backend.supports_fused_cpu_step(kv_caches[0]):
        return f"the {backend.name} attention backend does not read this cache with the C++ kernel"
    for layer in model.layers:
        for name in PROJECTIONS:
            proj = layer.get_submodule(name)
            if not isinstance(proj, QuantLinear) or proj.blocks is None:
                return "not every projection is block-quantized"
    return None


def layer_unsupported(model: LlamaForCausalLM) -> str | None:
    """Why the C++ step's layer (the table's norms, q/k norms, RoPE, window, soft-cap, output
    scale, SiLU or tanh-GELU) cannot compute this model's layers."""
    cfg = model.config
    if cfg.num_experts:
        return (f"{cfg.architecture}: mixture-of-experts layers (the C++ step computes one dense MLP per layer, "
                "not a router and its experts)")
    for layer in model.layers:
        if getattr(layer, "sublayer_norms", None) is None or activation(layer) not in ACTIVATIONS:
            return f"{cfg.architecture}: its layers ({type(layer).__name__}) are not ones the C++ step computes"
        attn = cast(Attention, layer.get_submodule("self_attn"))
        norms = [n for n in (*sublayer_norms(layer), attn.q_norm, attn.k_norm) if n is not None]
        if any(not isinstance(n, RMSNorm) or n.eps != model.norm.eps for n in norms):
            return f"{cfg.architecture}: norms of another kind or epsilon than the final norm's"
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


def measure_limit(step: FusedDecodeStep, model: LlamaForCausalLM, kv_caches: list[torch.Tensor],
                  max_decodes: int) -> Crossover:
    """The step's limit from the race of both paths (engine/tuning/fused_step.py), per model
    shape. Each synthetic sequence holds one block of the (still empty) cache, so the K/V
    written here is overwritten before any request reads it.
    """
    block_size, num_blocks = kv_caches[0].shape[2], kv_caches[0].shape[1]
    key = ":".join(map(str, (*step.dims.tolist(), step.cache_type, len(kv_caches), max_decodes)))

    def time_both(m: int) -> tuple[float, float]:
        ids, positions, meta = synthetic_decodes(m, block_size, step.embedding.shape[0])
        return (timing.best_time(lambda: step(ids, positions, meta), 3),
                timing.best_time(lambda: model(ids, positions, meta, kv_caches), 3))

    return fused_step.measure_limit(key, max_decodes, num_blocks, time_both)


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
