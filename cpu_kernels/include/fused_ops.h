// Fused element-wise ops of a decoder step (src/fused_ops.cpp). C ABI: the ctypes binding
// (cpu_kernels/fused_ops.py) and the fused decode step call the same functions.
// Present from the avx2 level up.
#pragma once
#include <cstdint>

extern "C" {

// x, residual, out [T, N]; weight [N]. add=0: residual is set to x (the first layer).
void add_rmsnorm_f32(const float* x, float* residual, const float* weight, float* out, int64_t T,
                     int64_t N, float eps, int add, int num_threads);

// gate_up [T, 2N] -> out [T, N]: silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void silu_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads);

// gate_up [T, 2N] -> out [T, N]: gelu_tanh(gate) * up (Gemma's GeGLU).
void gelu_tanh_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads);

}  // extern "C"
