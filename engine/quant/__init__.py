"""Quantized linear layers: block-quantized weights (Q8_0, Q4_1) read by the C++ block kernel
for few tokens per call, and for many a dense GEMM raced at load (fp32 BLAS, fp32 on oneDNN,
or bf16 on oneDNN where the CPU has bf16 dot products), picked per call by a measured crossover.

`quantize_model(model, mode, ...)` swaps a loaded model's linear layers for `QuantLinear`;
`resolve_mode` turns `--quantization auto` into a concrete mode for the device.
"""

from engine.quant.apply import quantize_model
from engine.quant.modes import resolve_mode

__all__ = ["quantize_model", "resolve_mode"]
