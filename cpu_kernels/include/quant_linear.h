// Linear layers on block-quantized weights (src/quant_linear.cpp). C ABI: the ctypes
// binding (cpu_kernels/quant_linear.py) and the fused decode step call the same functions.
// Present at every level (a portable body below avx2).
#pragma once
#include <cstdint>

extern "C" {

// y [M, N] = x [M, K] @ W^T (+ bias), W in Q4_1: qs [N, K/2], d and m [N, K/32] fp16.
void linear_q4_1(const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, int nthreads);

// y [M, N] = x [M, K] @ W^T (+ bias), W in Q8_0: qs [N, K] int8, d [N, K/32] fp16.
void linear_q8_0(const float* x, const int8_t* qs, const uint16_t* wd, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K, int nthreads);

// 1 when the AVX2 body was compiled in, 0 for the portable one.
int quant_kernel_uses_avx2();

}  // extern "C"
