"""Which dense GEMM a quantized layer runs for big steps: fp32 BLAS, fp32 on oneDNN or
bf16 on oneDNN, chosen by a race at load on this CPU.

Candidates are the GEMMs that hold the quality gate: fp32 (exact on the block weights),
through torch's BLAS or through oneDNN on a prepacked weight (onednn_gemm.py: the same
arithmetic, faster where BLAS is slow), and bf16. int8 W8A8 does not hold the gate
on this model, with per-tensor (fbgemm) or per-token activation scales alike
(docs/quantization.md), so it is a measuring option only (PAGODE_QUANT_GEMM=fbgemm). bf16
enters the race only where the CPU has bf16 dot products (AVX512-BF16 or AMX-BF16, within
PAGODE_CPU_ISA's cap): elsewhere oneDNN emulates it and it never wins, and timing it would
only slow the load. The race (engine/tuning/timing.py) times the candidates on RACE_TOKENS
tokens, one thread, best of a few runs, once per weight shape, and later starts on the same
machine read the winner back (engine/tuning/race_memory.py) and build only it; the losers' copies
are dropped, so an fp32 copy of the weights stays only where an fp32 GEMM wins.
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
from engine.quant.onednn_gemm import OnednnGemm
from engine.quant.onednn_gemm import available as onednn_available
from engine.tuning import race_memory, timing

log = logging.getLogger("pagode")

Gemm = DenseGemm | OnednnGemm | Bf16Gemm | Int8Gemm
GEMM_CLASSES = (DenseGemm, OnednnGemm, Bf16Gemm, Int8Gemm)
RACE_TOKENS = 64  # a serving step's size, where big-step GEMMs take over from the block kernel
# A taller weight (an lm_head of 150k rows) is raced on its first rows: every row costs the
# same, and building three candidates of the whole matrix to time them cost seconds a start.
RACE_ROWS = 8192
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

FP32_ONLY = ("fp32", "onednn")  # what an unquantized (--quantization none) layer may run

_winners: dict[tuple[int, int, tuple[str, ...]], str] = {}  # (N, K, candidates) -> the winner's name


def bf16_can_win() -> bool:
    """The CPU has bf16 dot products and the ISA cap lets pagode use them."""
    target = native.cpu_target()
    return target.target in ("avx512", "amx") and any(f in target.flags for f in BF16_FLAGS)


def candidates(allowed: tuple[str, ...] | None = None) -> list[str]:
    """The GEMMs that may win on this CPU, among `allowed` (default: all): fp32 BLAS always,
    oneDNN fp32 where torch has it, bf16 where the CPU has bf16 dot products."""
    names = ["fp32", *(["onednn"] if onednn_available() else []), *(["bf16"] if bf16_can_win() else [])]
    return [n for n in names if allowed is None or n in allowed]


def build(name: str, weight: torch.Tensor, bias: torch.Tensor | None, shared: bool) -> Gemm:
    if name == "fp32":
        return DenseGemm(weight, bias, shared)
    if name == "onednn":
        return OnednnGemm(weight, bias)
    if name == "bf16":
        return Bf16Gemm(weight, bias)
    return Int8Gemm(weight, bias)


def choose_gemm(weight: torch.Tensor, bias: torch.Tensor | None, shared: bool = False,
                allowed: tuple[str, ...] | None = None) -> Gemm:
    """The big-step GEMM for this fp32 weight, among `allowed` (PAGODE_QUANT_GEMM pins one)."""
    name, built = pick(weight.shape[0], weight.shape[1], lambda n: weight if n is None else weight[:n], bias,
                       shared, allowed)
    return built if built is not None else build(name, weight, bias, shared)


Rows = Callable[[int | None], torch.Tensor]  # a weight's first n rows in fp32 (None: all of them)


def pick(out_features: int, in_features: int, rows: Rows, bias: torch.Tensor | None, shared: bool = False,
         allowed: tuple[str, ...] | None = None) -> tuple[str, Gemm | None]:
    """The name of the big-step GEMM for this shape, and the whole weight's GEMM where its
    race built it (else None: the caller builds it, if it keeps one). The weight is asked
    for (`rows`) only where a race runs: a file's blocks are dequantized for it then, and
    never where a winner is pinned, remembered or the only candidate."""
    pinned = envs.QUANT_GEMM.get()
    if pinned != "auto" and (allowed is None or pinned in allowed):
        return pinned, None
    names = candidates(allowed)
    if len(names) == 1:
        return names[0], None
    key = (out_features, in_features, tuple(names))
    kept = race_memory.recall("big-step-gemm", ":".join(map(str, [*key[:2], *names])))
    if key not in _winners and kept in names:
        _winners[key] = kept
        log.info("big-step GEMM %dx%d: %s (of %s; measured at an earlier start)", key[0], key[1], kept,
                 ", ".join(names))
    if key in _winners:
        return _winners[key], None
    sliced = out_features > RACE_ROWS
    weight = rows(RACE_ROWS if sliced else None)
    built = {name: build(name, weight, None if bias is None else bias[:RACE_ROWS], shared) for name in names}
    _winners[key] = race(built, in_features)  # type: ignore[arg-type]
    race_memory.keep("big-step-gemm", ":".join(map(str, [*key[:2], *names])), _winners[key])
    log.info("big-step GEMM %dx%d: %s (of %s%s)", key[0], key[1], _winners[key], ", ".join(names),
             f"; raced on its first {RACE_ROWS} rows" if sliced else "")
    return _winners[key], None if sliced else built[_winners[key]]


def race(candidates: dict[str, Callable[[torch.Tensor], torch.Tensor]], in_features: int) -> str:
    """The fastest candidate on RACE_TOKENS random tokens, one thread, best of three."""
    x = torch.randn(RACE_TOKENS, in_features)
    winner, times = timing.fastest({name: functools.partial(gemm, x) for name, gemm in candidates.items()}, 3)
    log.debug("big-step GEMM race at %d tokens: %s", RACE_TOKENS,
              {k: round(v * 1e3, 3) for k, v in times.items()})
    return winner


def winners() -> dict[tuple[int, int], str]:
    """(N, K) -> the GEMM that won for that shape (the last race run for it)."""
    return {(n, k): name for (n, k, _), name in _winners.items()}
