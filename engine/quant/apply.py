"""Swap a loaded model's linear layers for QuantLinear, from GGUF blocks or fp32 weights.

With `file_blocks` (`--quantization auto` on a GGUF), a layer computes on the file's own
blocks whenever the kernel reads their format (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K; a fused
layer whose shards differ keeps them as parts), and a matrix in any other quantized format
is requantized to Q8_0, never to fewer bits than the file gave; float matrices take the
mode's format. Otherwise (int8/int4 asked for by name) a fused layer (qkv_proj,
gate_up_proj) takes the GGUF's blocks when every shard has the mode's format. llama.cpp's
Q/K row permutation was already undone on the rows, which keeps the blocks along the input
intact; whatever is not taken from the file is quantized from its fp32 weight.
Each shape's kernel crossover is measured once, and a layer keeps only the copies that its
crossover can pick for the step sizes the engine runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from engine import native
from engine.autotune import NO_LIMIT
from engine.quant import dispatch, formats, gemm_choice
from engine.quant.formats import Blocks, Kind
from engine.quant.gemm_choice import Gemm, choose_gemm
from engine.quant.linear import QuantLinear
from engine.quant.modes import weight_kind

log = logging.getLogger("pagode")

# Fused layer -> the HF weight names of its shards, in order.
SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
RawBlocks = dict[str, tuple[str, np.ndarray | None]]  # HF weight name -> (GGUF type, bytes [N, ...] or None)
FLOAT_TYPES = ("f32", "f16", "bf16")


@dataclass
class QuantReport:
    mode: str
    layers: int = 0
    from_gguf: int = 0
    block_bytes: int = 0
    dense_bytes: int = 0
    kept_fp32: list[str] = field(default_factory=list)
    crossovers: dict[str, int] = field(default_factory=dict)  # "kind NxK" -> max kernel tokens
    gemms: dict[str, str] = field(default_factory=dict)  # "NxK" -> the big-step GEMM (fp32, bf16)
    tile_from: dict[str, int] = field(default_factory=dict)  # "kind NxK" -> tokens from which the tile body runs

    def summary(self) -> str:
        cross = ", ".join(f"{k}: <= {v if v < NO_LIMIT else 'all'}" for k, v in self.crossovers.items())
        kinds = "+".join(sorted(set(self.gemms.values()))) or "no"
        tiles = ", ".join(f"{k}: >= {v}" for k, v in self.tile_from.items())
        return (f"{self.layers} linear layers ({self.from_gguf} from the GGUF's own blocks); resident "
                f"{self.block_bytes / 2**20:.0f} MiB of block weights + {self.dense_bytes / 2**20:.0f} MiB "
                f"of {kinds} weights for big steps; block kernel up to [{cross}] tokens per call"
                + (f", its AMX tile body from [{tiles}] tokens" if tiles else ""))


def quantize_model(model: nn.Module, mode: str, raw: RawBlocks | None = None, max_tokens: int = 512,
                   file_blocks: bool = False) -> QuantReport:
    """Replace every nn.Linear of `model` in place; `max_tokens` is the most tokens one step runs."""
    report = QuantReport(mode)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name, linear in targets:
        if not formats.quantizable(linear.in_features):
            report.kept_fp32.append(name)
            continue
        kind = weight_kind(mode, is_lm_head=name == "lm_head")
        shards = shard_names(name, tied)
        blocks = file_blocks_of(shards, raw or {}) if file_blocks else gguf_blocks(shards, kind, raw or {})
        if blocks is not None:  # the loaded fp32 weight is exactly what the blocks stand for
            report.from_gguf += 1
            weight = linear.weight.detach()
            dense = choose_gemm(weight, linear.bias, shared=name == "lm_head" and tied)
        else:
            kind = no_fewer_bits(shards, kind, raw or {}) if file_blocks else kind
            blocks = formats.quantize(linear.weight.detach().float(), kind)
            weight = formats.dequantize(blocks)
            dense = choose_gemm(weight, linear.bias)
        report.gemms[f"{dense.out_features}x{dense.in_features}"] = dense.name
        raced = raced_rows(blocks, dense, weight, linear.bias)
        layer = build_layer(blocks, dense, linear.bias, max_tokens, report, raced)
        set_module(model, name, layer)
        report.layers += 1
        report.block_bytes += 0 if layer.blocks is None else layer.blocks.nbytes
        report.dense_bytes += 0 if layer.gemm is None else layer.gemm.nbytes
    if report.kept_fp32:
        log.warning("kept in fp32 (input size not a multiple of 32): %s", report.kept_fp32)
    return report


def raced_rows(blocks: Blocks, dense: Gemm, weight: torch.Tensor,
               bias: torch.Tensor | None) -> tuple[Blocks, Gemm] | None:
    """A tall layer's first rows as blocks and as the GEMM that won its race, for the load-time
    races to time instead of the whole matrix; None for a layer that is not taller."""
    n = gemm_choice.RACE_ROWS
    rows = dispatch.first_rows(blocks, n)
    if rows is blocks:
        return None
    return rows, gemm_choice.build(dense.name, weight[:n], None if bias is None else bias[:n], True)


def build_layer(blocks: Blocks, dense: Gemm, bias: torch.Tensor | None, max_tokens: int,
                report: QuantReport, raced: tuple[Blocks, Gemm] | None = None) -> QuantLinear:
    """Measure this shape's crossover; keep the dense copy only if steps of <= max_tokens can pick it.

    The blocks stay even where the GEMM wins at one token: the fused decode step
    (engine/model/decode_step.py) computes every projection on them.
    """
    if native.block_linear() is None:
        return QuantLinear(None, dense, bias, 0)
    shape = f"{blocks.kind} {blocks.out_features}x{blocks.in_features}"
    tile_from = dispatch.switch_to_tiles(blocks, None if raced is None else raced[0])
    if tile_from:
        report.tile_from[shape] = tile_from
    if raced is not None:  # the raced rows run the tile body from the same count
        for part in raced[0].parts:
            part.tile_from = tile_from
    timed_blocks, timed_gemm = (None, dense) if raced is None else raced
    crossover = dispatch.measure(blocks, timed_gemm, timed_blocks).max_kernel_tokens
    report.crossovers[shape] = crossover
    gemm = None if crossover >= max_tokens else dense  # steps never get big enough for the GEMM
    return QuantLinear(blocks, gemm, bias, crossover)


def gguf_blocks(names: list[str], kind: Kind, raw: RawBlocks) -> Blocks | None:
    """A layer's weight straight from the GGUF's blocks, if every shard is already `kind`."""
    found = [raw.get(n) for n in names]
    if any(f is None or formats.kernel_kind(f[0]) != kind for f in found):
        return None
    return file_blocks_of(names, raw)


def file_blocks_of(names: list[str], raw: RawBlocks) -> Blocks | None:
    """A layer's weight as the file's own blocks, if the kernel reads every shard's format."""
    found = [raw.get(n) for n in names]
    if not all(f is not None and f[0] in formats.GGUF_BLOCK_BYTES and f[1] is not None for f in found):
        return None
    parts = [formats.from_gguf(f[1], f[0]) for f in found if f is not None and f[1] is not None]
    return parts[0] if len(parts) == 1 else formats.concat_rows(parts)


def no_fewer_bits(names: list[str], kind: Kind, raw: RawBlocks) -> Kind:
    """`kind` for a float matrix; Q8_0 for one the file quantized in a format the kernel
    does not read (Q5_0, IQ4_NL, ...), so the file's precision is never lowered."""
    quantized = any(f is not None and f[0] not in FLOAT_TYPES for f in (raw.get(n) for n in names))
    return "q8_0" if quantized else kind


def shard_names(name: str, tied: bool) -> list[str]:
    """HF weight names that make up our layer `name` (a tied lm_head is the embedding)."""
    if name == "lm_head":
        return ["model.embed_tokens.weight" if tied else "lm_head.weight"]
    prefix, _, leaf = name.rpartition(".")
    return [f"model.{prefix}.{s}.weight" for s in SHARDS.get(leaf, (leaf,))]


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` at the dotted path `name` of `model`."""
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, leaf, module)
