"""The dense GEMMs a quantized layer may run for big steps: fp32 BLAS, fp32 on oneDNN or bf16
on oneDNN, the ones that may win on this CPU, and building one.

Candidates are the GEMMs that hold the quality gate: fp32 (exact on the block weights),
through torch's BLAS or through oneDNN on a prepacked weight (onednn_gemm.py: the same
arithmetic, faster where BLAS is slow), and bf16. int8 W8A8 does not hold the gate
on this model, with per-tensor (fbgemm) or per-token activation scales alike
(docs/quantization.md), so it is a measuring option only (PAGODE_QUANT_GEMM=fbgemm). bf16
is a candidate only where the CPU has bf16 dot products (AVX512-BF16 or AMX-BF16, within
PAGODE_CPU_ISA's cap). Which candidate a shape runs is raced at load
(engine/tuning/gemm_choice.py), or pinned by PAGODE_QUANT_GEMM.
"""

from __future__ import annotations

import torch

from engine import envs
from engine.quant.bf16_gemm import Bf16Gemm
from engine.quant.dense_gemm import DenseGemm
from engine.quant.int8_gemm import Int8Gemm
from engine.quant.onednn_gemm import OnednnGemm
from engine.quant.onednn_gemm import available as onednn_available
from engine.tuning import gemm_choice
from engine.tuning.gemm_choice import Rows, bf16_can_win

Gemm = DenseGemm | OnednnGemm | Bf16Gemm | Int8Gemm
GEMM_CLASSES = (DenseGemm, OnednnGemm, Bf16Gemm, Int8Gemm)

FP32_ONLY = ("fp32", "onednn")  # what an unquantized (--quantization none) layer may run


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


def pick(out_features: int, in_features: int, rows: Rows, bias: torch.Tensor | None, shared: bool = False,
         allowed: tuple[str, ...] | None = None) -> tuple[str, Gemm | None]:
    """The name of the big-step GEMM for this shape, and the whole weight's GEMM where its
    race built it (else None: the caller builds it, if it keeps one): the pinned one, the
    only candidate, or the race's winner."""
    pinned = envs.QUANT_GEMM.get()
    if pinned != "auto" and (allowed is None or pinned in allowed):
        return pinned, None
    names = candidates(allowed)
    if len(names) == 1:
        return names[0], None
    return gemm_choice.pick(out_features, in_features, names, rows, bias, shared, build)
