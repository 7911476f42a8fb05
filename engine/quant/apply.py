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

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from engine import native
from engine.quant import dispatch, formats, gemms
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.formats import Blocks, Kind
from engine.quant.gemms import GEMM_CLASSES, Gemm, choose_gemm
from engine.quant.linear import QuantLinear
from engine.quant.modes import weight_kind
from engine.tuning import gemm_choice, kernel_crossover
from engine.tuning.timing import NO_LIMIT

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
    int8_tokens: list[str] = field(default_factory=list)  # "kind NxK" whose tile body takes int8 tokens past 8

    def summary(self) -> str:
        cross = ", ".join(f"{k}: <= {v if v < NO_LIMIT else 'all'}" for k, v in self.crossovers.items())
        kinds = "+".join(sorted(set(self.gemms.values()))) or "no"
        tiles = ", ".join(f"{k}: >= {v}" for k, v in self.tile_from.items())
        return (f"{self.layers} linear layers ({self.from_gguf} from the GGUF's own blocks); resident "
                f"{self.block_bytes / 2**20:.0f} MiB of block weights + {self.dense_bytes / 2**20:.0f} MiB "
                f"of {kinds} weights for big steps; block kernel up to [{cross}] tokens per call"
                + (f", its AMX tile body from [{tiles}] tokens" if tiles else "")
                + (f" (int8 tokens past 8 on [{', '.join(self.int8_tokens)}])" if self.int8_tokens else ""))


def quantize_model(model: nn.Module, mode: str, raw: RawBlocks | None = None, max_tokens: int = 512,
                   file_blocks: bool = False) -> QuantReport:
    """Replace every nn.Linear of `model` in place; `max_tokens` is the most tokens one step runs.

    A layer taken from the file's blocks never reads its nn.Linear's weight (a loader may
    leave it unread: file_weights): its dense copy, where it keeps one, is the file's blocks
    dequantized, the very values a loader would have put there."""
    report = QuantReport(mode)
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name, linear in targets:
        if not formats.quantizable(linear.in_features):
            report.kept_fp32.append(name)
            continue
        kind = weight_kind(mode, is_lm_head=name == "lm_head")
        shards = shard_names(name, tied)
        blocks = file_blocks_of(shards, raw or {}) if takes_file_blocks(shards, kind, raw or {}, file_blocks) else None
        if blocks is not None:
            report.from_gguf += 1
            shared = name == "lm_head" and tied  # the embedding's weight, loaded as floats
            rows = (functools.partial(loaded_rows, linear.weight.detach()) if shared
                    else functools.partial(file_rows, shards, raw or {}, linear.in_features))
            bf16_rows = None if shared else functools.partial(file_rows, shards, raw or {}, linear.in_features,
                                                               dtype=torch.bfloat16)
            gemm_name, whole = gemms.pick(linear.out_features, linear.in_features, rows, linear.bias, shared)
            dense: Gemm | DenseFor = whole if whole is not None else functools.cache(
                functools.partial(build_dense, gemm_name, rows, bf16_rows, linear.bias, shared))
            raced: tuple[Blocks, Gemm | DenseFor] | None = tall_rows(blocks, gemm_name, rows, bf16_rows,
                                                                      linear.bias)
        else:
            kind = no_fewer_bits(shards, kind, raw or {}) if file_blocks else kind
            blocks = formats.quantize(linear.weight.detach().float(), kind)
            weight = formats.dequantize(blocks)
            dense = choose_gemm(weight, linear.bias)
            gemm_name = dense.name
            raced = raced_rows(blocks, dense, weight, linear.bias)
        report.gemms[f"{linear.out_features}x{linear.in_features}"] = gemm_name
        layer = build_layer(blocks, dense, linear.bias, max_tokens, report, raced)
        set_module(model, name, layer)
        report.layers += 1
        report.block_bytes += 0 if layer.blocks is None else layer.blocks.nbytes
        report.dense_bytes += 0 if layer.gemm is None else layer.gemm.nbytes
    if report.kept_fp32:
        log.warning("kept in fp32 (input size not a multiple of 32): %s", report.kept_fp32)
    return report


def file_weights(model: nn.Module, mode: str, raw: RawBlocks, file_blocks: bool) -> set[str]:
    """The HF names of the weights that quantize_model will take as the file's blocks, so that
    a loader can skip reading them as floats (the fp32 model a 1.7B file would otherwise be
    built on is 7 GB). A tied lm_head is the embedding, which is loaded whatever happens."""
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    names: set[str] = set()
    for name, linear in model.named_modules():
        if not isinstance(linear, nn.Linear) or (name == "lm_head" and tied):
            continue
        shards = shard_names(name, tied)
        kind = weight_kind(mode, is_lm_head=name == "lm_head")
        if formats.quantizable(linear.in_features) and takes_file_blocks(shards, kind, raw, file_blocks):
            names.update(shards)
    return names


def takes_file_blocks(names: list[str], kind: Kind, raw: RawBlocks, file_blocks: bool) -> bool:
    """Whether a layer computes on the file's blocks: with `file_blocks`, where the kernel reads
    every shard's format; else where every shard already is `kind`."""
    found = [raw.get(n) for n in names]
    if not all(f is not None and f[0] in formats.GGUF_BLOCK_BYTES and f[1] is not None for f in found):
        return False
    return file_blocks or all(f is not None and formats.kernel_kind(f[0]) == kind for f in found)


DenseFor = Callable[[], Gemm]  # a dense GEMM built when first asked for (a layer may keep none)


def loaded_rows(weight: torch.Tensor, n: int | None) -> torch.Tensor:
    return weight if n is None else weight[:n]


def file_rows(names: list[str], raw: RawBlocks, in_features: int, n: int | None,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The first n rows (None: all) of a layer's shards, dequantized from the file's blocks: in
    fp32 the values a loader gets from the same bytes (its Q/K rows already in HF order); in
    bf16 those values as torch rounds them, the fp32 never stored."""
    parts, left = [], n
    for name in names:
        kind, data = raw[name]
        assert data is not None
        if left is not None:
            data = data[:left]
            left -= data.shape[0]
        parts.append(data)
        if left == 0:
            break
    out = torch.empty(sum(d.shape[0] for d in parts), in_features, dtype=dtype)
    start = 0
    for name, data in zip(names, parts, strict=False):
        rows = data.shape[0]
        file_values(data, raw[name][0], out[start:start + rows].view(-1))
        start += rows
    return out


def file_values(data: np.ndarray, kind: str, out: torch.Tensor) -> None:
    """GGUF block bytes into `out` (flat, fp32 or bf16): the CPU kernels' dequantizer (gguf-py's
    values, on every thread), gguf-py where that is not built."""
    from gguf import GGMLQuantizationType

    ggml_type = GGMLQuantizationType[kind.upper()]
    kernel = native.dequantizer()
    if kernel is not None and kernel(data, int(ggml_type), out.dtype, out) is not None:
        return
    from gguf.quants import dequantize

    values = np.array(dequantize(np.ascontiguousarray(data), ggml_type), dtype=np.float32).reshape(-1)
    out.copy_(torch.from_numpy(values))  # rounded by torch where out is bf16


def build_dense(name: str, rows: Callable[[int | None], torch.Tensor],
                bf16_rows: Callable[[int | None], torch.Tensor] | None, bias: torch.Tensor | None,
                shared: bool) -> Gemm:
    """The named GEMM on the whole weight; a bf16 one from `bf16_rows` where given (a file's
    blocks dequantized straight to bf16: the same bits as the fp32 weight rounded)."""
    if name == "bf16" and bf16_rows is not None:
        return Bf16Gemm(bf16_rows(None), bias)
    return gemms.build(name, rows(None), bias, shared)


def tall_rows(blocks: Blocks, gemm_name: str, rows: Callable[[int | None], torch.Tensor],
              bf16_rows: Callable[[int | None], torch.Tensor] | None,
              bias: torch.Tensor | None) -> tuple[Blocks, DenseFor] | None:
    """A tall layer's first rows as blocks and a builder of the named GEMM on the same rows
    (built only if a race times it); None for a layer that is not taller."""
    n = gemm_choice.RACE_ROWS
    first = dispatch.first_rows(blocks, n)
    if first is blocks:
        return None
    first_bf16 = None if bf16_rows is None else functools.partial(rows_up_to, bf16_rows, n)
    return first, functools.partial(build_dense, gemm_name, functools.partial(rows_up_to, rows, n), first_bf16,
                                    None if bias is None else bias[:n], True)


def rows_up_to(rows: Callable[[int | None], torch.Tensor], n: int, _: int | None) -> torch.Tensor:
    return rows(n)


def raced_rows(blocks: Blocks, dense: Gemm, weight: torch.Tensor,
               bias: torch.Tensor | None) -> tuple[Blocks, DenseFor] | None:
    """tall_rows for a layer whose weight is already loaded: its first rows as blocks and as
    the GEMM that won its race, for the load-time races to time instead of the whole matrix;
    None for a layer that is not taller."""
    return tall_rows(blocks, dense.name, functools.partial(loaded_rows, weight), None, bias)


def build_layer(blocks: Blocks, dense: Gemm | DenseFor, bias: torch.Tensor | None, max_tokens: int,
                report: QuantReport, raced: tuple[Blocks, Gemm | DenseFor] | None = None) -> QuantLinear:
    """Measure this shape's crossover; keep the dense copy only if steps of <= max_tokens can pick it.

    The blocks stay even where the GEMM wins at one token: the fused decode step
    (engine/model/decode_step.py) computes every projection on them. A dense GEMM given as
    a builder is built only if a race times it or the layer keeps it.
    """
    if native.block_linear() is None:
        return QuantLinear(None, built(dense), bias, 0)
    shape = f"{blocks.kind} {blocks.out_features}x{blocks.in_features}"
    parts = [*blocks.parts, *([] if raced is None else raced[0].parts)]  # the raced rows switch as the layer
    for part in parts:
        part.int8_tokens = False  # exact until the races below say the layer keeps a GEMM
    tile_from = dispatch.switch_to_tiles(blocks, None if raced is None else raced[0])
    if tile_from:
        report.tile_from[shape] = tile_from
    for part in parts:
        part.tile_from = tile_from
    crossover = kernel_crossover_of(blocks, dense, raced)
    if crossover < max_tokens and tile_from and dispatch.int8_tokens_allowed():
        # The layer keeps a GEMM for big steps, so its sizes between may trade the tile body's
        # exact tokens for int8 ones: raced again, the kernel so switched against the GEMM.
        for part in parts:
            part.int8_tokens = True
        crossover = kernel_crossover_of(blocks, dense, raced)
        if shape not in report.int8_tokens:
            report.int8_tokens.append(shape)
    report.crossovers[shape] = crossover
    gemm = None if crossover >= max_tokens else built(dense)  # steps never get big enough for the GEMM
    return QuantLinear(blocks, gemm, bias, crossover)


def kernel_crossover_of(blocks: Blocks, dense: Gemm | DenseFor, raced: tuple[Blocks, Gemm | DenseFor] | None) -> int:
    """Up to how many tokens the block kernel, as its parts are switched, beats the GEMM."""
    found = kernel_crossover.known(dispatch.shape_key(blocks))
    if found is None:
        timed_blocks, timed_gemm = (None, built(dense)) if raced is None else (raced[0], built(raced[1]))
        found = dispatch.measure(blocks, timed_gemm, timed_blocks)
    return found.max_kernel_tokens


def built(dense: Gemm | DenseFor) -> Gemm:
    return dense if isinstance(dense, GEMM_CLASSES) else dense()


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
