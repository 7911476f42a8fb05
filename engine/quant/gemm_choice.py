"""Which dense GEMM a quantized layer runs for big steps: fp32 BLAS or bf16 on oneDNN,
chosen by a race at load on this CPU.

Candidates are the GEMMs that hold the quality gate: fp32 (exact on the block weights) and
bf16. int8 W8A8 does not hold it on this model, with per-tensor (fbgemm) or per-token
activation scales alike (docs/quantization.md), so it is a measuring option only
(PAGODE_QUANT_GEMM=fbgemm). bf16 enters the race only where the CPU has bf16 dot products
(AVX512-BF16 or AMX-BF16, within PAGODE_CPU_ISA's cap): elsewhere oneDNN emulates it and it
never wins, and timing it would only slow the load. The race times both on RACE_TOKENS
tokens, one thread, best of a few runs, once per weight shape; the loser's copy is never
built, so the fp32 copy of the weights stays only where fp32 wins.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine import envs, native
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.dense_gemm import DenseGemm
from engine.quant.int8_gemm import Int8Gemm

log = logging.getLogger("pagode")

Gemm = DenseGemm | Bf16Gemm | Int8Gemm
RACE_TOKENS = 64  # a serving step's size, where big-step GEMMs take over from the block kernel
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

_winners: dict[tuple[int, int], str] = {}  # (N, K) -> "fp32" | "bf16"


def bf16_can_win() -> bool:
    """The CPU has bf16 dot products and the ISA cap lets pagode use them."""
    target = native.cpu_target()
    return target.target in ("avx512", "amx") and any(f in target.flags for f in BF16_FLAGS)


def choose_gemm(weight: torch.Tensor, bias: torch.Tensor | None, shared: bool = False) -> Gemm:
    """The big-step GEMM for this fp32 weight (PAGODE_QUANT_GEMM pins one)."""
    pinned = envs.QUANT_GEMM.get()
    if pinned == "fbgemm":
        return Int8Gemm(weight, bias)
    if pinned == "bf16":
        return Bf16Gemm(weight, bias)
    fp32 = DenseGemm(weight, bias, shared)
    if pinned == "fp32" or not bf16_can_win():
        return fp32
    key = (fp32.out_features, fp32.in_features)
    if key not in _winners:
        bf16 = Bf16Gemm(weight, bias)
        _winners[key] = race({"fp32": fp32, "bf16": bf16}, fp32.in_features)
        log.info("big-step GEMM %dx%d: %s", key[0], key[1], _winners[key])
        return fp32 if _winners[key] == "fp32" else bf16
    return fp32 if _winners[key] == "fp32" else Bf16Gemm(weight, bias)


def race(candidates: dict[str, Callable[[torch.Tensor], torch.Tensor]], in_features: int) -> str:
    """The fastest candidate on RACE_TOKENS random tokens, one thread, best of three."""
    from engine.quant.dispatch import best_time

    x = torch.randn(RACE_TOKENS, in_features)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            times = {name: best_time(functools.partial(gemm, x), 3) for name, gemm in candidates.items()}
    finally:
        torch.set_num_threads(threads)
    log.debug("big-step GEMM race at %d tokens: %s", RACE_TOKENS,
              {k: round(v * 1e3, 3) for k, v in times.items()})
    return min(times, key=lambda name: times[name])


def winners() -> dict[tuple[int, int], str]:
    return dict(_winners)
