"""`--quantization {auto,none,int8,int4}`: what each mode stores, and what `auto` picks.

int8: every linear layer (and the lm_head) in Q8_0 blocks.
int4: the projections in Q4_1 blocks (a GGUF's own Q4_1 tensors, used as they are), the
      lm_head in Q8_0 (as llama.cpp keeps the output matrix at 8 bits or more).
Both keep a dense copy for steps with many tokens (the GEMM that won the race at load:
engine/tuning/gemm_choice.py), where their crossover needs it.
`auto` picks int4 on a CPU with the AVX2 kernel: it is the fastest mode measured
(benchmarks/bench_quant.py) and it passes the quality gate (tests/test_quantization.py).
CUDA keeps bf16/fp16: there is no GPU kernel.
"""

from __future__ import annotations

import logging

import torch

from engine import native
from engine.config import QUANTIZATION_MODES
from engine.quant.formats import Kind

log = logging.getLogger("pagode")

AUTO_CPU_MODE = "int4"


def validate(mode: str) -> str:
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {QUANTIZATION_MODES}, not {mode!r}")
    return mode


def resolve_mode(requested: str, device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """(the concrete mode, why) for this device and activation dtype."""
    validate(requested)
    if requested == "none":
        return "none", "requested"
    if device.type != "cpu":
        return "none", f"no GPU kernel for quantized weights; {device.type} keeps {dtype} weights"
    if dtype != torch.float32:
        if requested != "auto":
            raise ValueError(f"--quantization {requested} computes in float32 on the CPU; drop --dtype {dtype}")
        return "none", f"quantized layers compute in float32, not {dtype}"
    if requested != "auto":
        return requested, "requested"
    kernel = native.block_linear()
    if kernel is None or not kernel.uses_avx2():
        return "none", "auto: no AVX2 quantized-linear kernel on this CPU"
    return AUTO_CPU_MODE, "auto: the fastest mode that passes the quality gate on this CPU"


def weight_kind(mode: str, is_lm_head: bool) -> Kind:
    return "q4_1" if mode == "int4" and not is_lm_head else "q8_0"
