// Fused element-wise ops of a decoder step (src/fused_ops.cpp). C ABI: the ctypes binding
// (cpu_kernels/fused_ops.py) and the fused decode step call the same functions.
// Present from the avx2 level up.
#pragma once
#include <cstdint>

extern "C" {

// x, residual, out [T, N]; weight [N]. add=0: residual is set to x (the first layer).
void add_rmsnorm_f32(const float* x, float* residual, const float* weight, float* out, int64_t T,
                     int64_t N, float eps, int add, int num_threads);

// qkv [T, row_stride]: RMSNorm in place on each token's queries (columns [0, q_width), in
// rows of q_norm with q_weight) and keys (the next k_width columns, rows of k_norm): Qwen3's
// per-head norms (q_norm = head_dim) or OLMo 2's over the whole projection (q_norm = q_width).
void qk_rmsnorm_f32(float* qkv, int64_t T, int64_t row_stride, int64_t q_width, int64_t k_width,
                    int64_t q_norm, int64_t k_norm, const float* q_weight, const float* k_weight, float eps,
                    int num_threads);

// gate_up [T, 2N] -> out [T, N]: silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void silu_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads);
// The same on bf16 rows (computed in fp32, rounded to nearest even as torch rounds).
void silu_and_mul_bf16(const uint16_t* gate_up, uint16_t* out, int64_t T, int64_t N, int num_threads);

// gate_up [T, 2N] -> out [T, N]: gelu_tanh(gate) * up (Gemma's GeGLU).
void gelu_tanh_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads);
void gelu_tanh_and_mul_bf16(const uint16_t* gate_up, uint16_t* out, int64_t T, int64_t N, int num_threads);

}  // extern "C"
