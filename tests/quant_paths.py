"""Pin every quantized layer of a loaded model to one kernel, for tests that read through each.

A QuantLinear picks its kernel by its crossover (max_kernel_tokens): pinning sets that
crossover so that every call takes the block kernel ("kernel") or the dense GEMM ("gemm"),
and puts the measured one back on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from engine.autotune import NO_LIMIT
from engine.llm import LLM
from engine.quant.linear import Path, QuantLinear


@contextlib.contextmanager
def pinned_path(llm: LLM, path: Path | None) -> Iterator[None]:
    """Every QuantLinear of `llm` on `path` inside the block; None leaves each on its crossover."""
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantLinear)]
    saved = [layer.max_kernel_tokens for layer in layers]
    if path is not None:
        for layer in layers:
            if (layer.blocks if path == "kernel" else layer.gemm) is None:
                raise ValueError(f"a layer keeps no weights for the {path} path: {layer.extra_repr()}")
            layer.max_kernel_tokens = NO_LIMIT if path == "kernel" else 0
    try:
        yield
    finally:
        for layer, crossover in zip(layers, saved, strict=True):
            layer.max_kernel_tokens = crossover
