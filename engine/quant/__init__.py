"""Quantized linear layers: block-quantized weights (Q8_0, Q4_1) read by an AVX2 kernel for
few tokens per step, fbgemm's dynamic int8 GEMM for many, picked per call by a measured crossover.

`quantize_model(model, mode, ...)` swaps a loaded model's linear layers for `QuantLinear`;
`resolve_mode` turns `--quantization auto` into a concrete mode for the device.
"""

from engine.quant.apply import quantize_model
from engine.quant.modes import MODES, resolve_mode

__all__ = ["MODES", "quantize_model", "resolve_mode"]
