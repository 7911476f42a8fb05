"""Every PAGODE_* environment switch, typed and documented once, and read when used.

Like vLLM's `envs.py`: the one place that reads pagode's variables. Each is read at the
moment it is asked for (never at import time), so a test or a user can set one before
any call. They are knobs for operators and benchmarks, never a channel for passing
state to a child process: a server is steered by its flags.

    from engine import envs
    if envs.CPU_KERNEL.get(): ...

`python -m engine.envs` prints them all with their current values.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


def _flag(text: str) -> bool:
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected 0 or 1, got {text!r}")


def _optional_int(text: str) -> int | None:
    return int(text)


def _optional_str(text: str) -> str | None:
    return text


def _gib(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("expected a size in GiB, 0 or more")
    return value


def _cpu_isa(text: str) -> str | None:
    if text.strip().lower() not in ("avx2", "avx512", "amx"):
        raise ValueError("expected avx2, avx512 or amx")
    return text.strip().lower()


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value
    return parse


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One variable: its name, how its text is parsed, its default and what it does."""

    name: str
    parse: Callable[[str], T]
    default: T
    doc: str

    def get(self) -> T:
        """The current value; an unset or empty variable gives the default."""
        raw = os.environ.get(self.name, "")
        if raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.name}={raw!r}: {exc}") from exc

    def is_set(self) -> bool:
        return os.environ.get(self.name, "") != ""


CACHE_DIR: EnvVar[Path] = EnvVar(
    "PAGODE_CACHE_DIR", Path, Path.home() / ".cache" / "pagode",
    "Root of pagode's caches: compiled CPU kernels (kernels/), tokenizers built from GGUF "
    "files (tokenizers/), load-time race results (races/) and the planner's step-time fits (plan/).")
CPU_KERNEL: EnvVar[bool] = EnvVar(
    "PAGODE_CPU_KERNEL", _flag, True,
    "0 turns every C++ CPU kernel off; the pure-torch paths remain.")
CPU_ISA: EnvVar[str | None] = EnvVar(
    "PAGODE_CPU_ISA", _cpu_isa, None,
    "avx2, avx512 or amx: caps the instruction set the CPU kernels are compiled for. It lowers "
    "the level detected on this CPU (cpu_kernels/isa.py), never raises it; unset: the best "
    "level the CPU runs.")
QUANT_KERNEL: EnvVar[bool] = EnvVar(
    "PAGODE_QUANT_KERNEL", _flag, True,
    "0 turns the block-quantized linear kernel off (quantized layers then run on their big-step GEMM, "
    "and --quantization auto falls back to none).")
DECODE_STEP: EnvVar[bool] = EnvVar(
    "PAGODE_DECODE_STEP", _flag, True,
    "0 turns the fused C++ decode step off: decode steps run layer by layer.")
PREFILL_KERNEL: EnvVar[str] = EnvVar(
    "PAGODE_PREFILL_KERNEL", _choice("auto", "kernel", "maskless"), "auto",
    "CPU prefill/extend attention: auto (the fused C++ kernel or torch's maskless flash path, "
    "raced at load per attention shape), kernel, or maskless (today's torch paths only).")
PREFILL_BF16: EnvVar[str] = EnvVar(
    "PAGODE_PREFILL_BF16", _choice("auto", "on", "off"), "auto",
    "CPU prefill/extend attention's bf16 products (AMX tiles or AVX512-BF16) on an fp32/fp16 "
    "KV cache: auto (chunks as big as the steps whose projections run bf16 GEMMs already), "
    "on (every chunk the kernel takes), off (fp32 throughout).")
ATTENTION_BACKEND: EnvVar[str | None] = EnvVar(
    "PAGODE_ATTENTION_BACKEND", _optional_str, None,
    "cpu, sdpa or triton; overrides the device's default (cpu on CPU, triton on CUDA) when "
    "--attention-backend is not given (torch: a deprecated alias of cpu).")
QUANT_GEMM: EnvVar[str] = EnvVar(
    "PAGODE_QUANT_GEMM", _choice("auto", "fp32", "onednn", "bf16", "fbgemm"), "auto",
    "The many-tokens path of quantized layers: auto (fp32 BLAS, fp32 on oneDNN, and bf16 on "
    "oneDNN where the CPU has bf16 dot products, raced at load), fp32, onednn, bf16, or "
    "fbgemm (int8; to measure it only, it fails the quality gate).")
QUANT_CROSSOVER: EnvVar[int | None] = EnvVar(
    "PAGODE_QUANT_CROSSOVER", _optional_int, None,
    "Pins the block kernel's crossover to N tokens per call instead of measuring it at load "
    "(reproducible runs).")
QUANT_TILES: EnvVar[int | None] = EnvVar(
    "PAGODE_QUANT_TILES", _optional_int, None,
    "Pins the step size from which the block kernel runs its tile body (amx builds) to N tokens "
    "per call, 0 never, instead of measuring it at load (reproducible runs).")
TILE_BF16: EnvVar[bool] = EnvVar(
    "PAGODE_TILE_BF16", _flag, False,
    "1: the block kernel's AMX tile body takes steps of more than 8 tokens with bf16 tokens, "
    "and from 17 on bf16 panels of the weights (the big-step GEMM's precision, faster); 0 (the "
    "default): exact on the blocks at every size.")
TILE_INT8: EnvVar[bool] = EnvVar(
    "PAGODE_TILE_INT8", _flag, False,
    "1: on a layer that keeps a dense GEMM for big steps, the block kernel's AMX tile body "
    "takes steps of more than 8 tokens with the tokens rounded to int8 in blocks of 32 (the "
    "activations of llama.cpp's K-quant dot products) and multiplies the weights' own integers "
    "on the tile unit's int8 products (every format but Q8_0): faster from 9 to 32 tokens, but "
    "a prompt's greedy tokens then depend on whether it crosses 8 tokens; 0 (the default): "
    "exact on the blocks at every size. PAGODE_TILE_BF16=1 takes precedence.")
BF16_KERNEL: EnvVar[bool] = EnvVar(
    "PAGODE_BF16_KERNEL", _flag, True,
    "1 (the default): where the kernels are built for AMX, a layer's bf16 GEMM runs steps of up to "
    "the size a load-time race finds on pagode's own AMX kernel, on the same weight as oneDNN "
    "(engine/tuning/bf16_crossover.py); 0: oneDNN's at every size.")
FBGEMM_REDUCE_RANGE: EnvVar[bool] = EnvVar(
    "PAGODE_FBGEMM_REDUCE_RANGE", _flag, True,
    "fbgemm's int8 activations use a 7-bit range (1, the default) so that AVX2's 16-bit pair "
    "sums cannot saturate; 0 uses the full 8 bits.")
RACE_CACHE: EnvVar[bool] = EnvVar(
    "PAGODE_RACE_CACHE", _flag, True,
    "0: race the kernels at every load and keep nothing (engine/tuning/race_memory.py); 1 (the "
    "default): a result measured on this machine is read back instead of measured again.")
PACK_KEEP_FREE_GIB: EnvVar[float] = EnvVar(
    "PAGODE_PACK_KEEP_FREE_GIB", _gib, 4.0,
    "The free disk space, in GiB, that saving a pack of prepacked weights must leave under "
    "PAGODE_CACHE_DIR/prepacked (engine/model/prepack.py): a pack is a cache, and the disk may "
    "be the one the models and logs need; 0 saves a pack wherever it fits.")
HEAP_KEEP: EnvVar[bool] = EnvVar(
    "PAGODE_HEAP_KEEP", _flag, True,
    "1 (the default): once a model is loaded, glibc keeps freed big blocks in the heap for the "
    "next step instead of unmapping them (engine/runner/heap.py); 0 leaves glibc's defaults.")
KV_POPULATE: EnvVar[bool] = EnvVar(
    "PAGODE_KV_POPULATE", _flag, True,
    "1 (the default): a background thread at the lowest CPU priority faults in the CPU KV cache's "
    "pages ahead of the blocks the engine hands out (engine/runner/kv_populate.py); 0: each step's "
    "first write to a block faults its pages in.")
API_KEY: EnvVar[str | None] = EnvVar(
    "PAGODE_API_KEY", _optional_str, None,
    "The default of `pagode serve --api-key`: a Bearer token on the API routes.")

# Not pagode's own, so not in ALL (the PAGODE_* switches), but read here like them.
ALLOW_RUNTIME_LORA_UPDATING: EnvVar[bool] = EnvVar(
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING", _flag, False,
    "vLLM's switch, taken as the default of `pagode serve --enable-lora-runtime-updates`: "
    "POST /v1/load_lora_adapter and /v1/unload_lora_adapter.")
CXX: EnvVar[str | None] = EnvVar(
    "CXX", _optional_str, None,
    "The C++ compiler of the CPU kernels (the usual variable); unset: g++, then c++, on PATH.")

ALL: tuple[EnvVar[object], ...] = (CACHE_DIR, CPU_KERNEL, CPU_ISA, QUANT_KERNEL, DECODE_STEP,  # type: ignore[assignment]
                                   PREFILL_KERNEL, PREFILL_BF16, ATTENTION_BACKEND, QUANT_GEMM, QUANT_CROSSOVER,
                                   QUANT_TILES, TILE_BF16, TILE_INT8, BF16_KERNEL, FBGEMM_REDUCE_RANGE,
                                   RACE_CACHE, PACK_KEEP_FREE_GIB, HEAP_KEEP, KV_POPULATE, API_KEY)


def describe() -> str:
    """Each variable, its current value and what it does (for `python -m engine.envs`)."""
    lines = []
    for var in ALL:
        shown = "***" if var is API_KEY and var.is_set() else var.get()
        lines.append(f"{var.name}={shown}\n    {var.doc}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
