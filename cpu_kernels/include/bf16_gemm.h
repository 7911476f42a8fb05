// A bf16 GEMM on AMX tiles for steps of tens of tokens (src/bf16_gemm.cpp). C ABI: the
// ctypes binding (cpu_kernels/bf16_gemm_kernel.py). Present in the amx build only.
#pragma once
#include <cstdint>

// What y holds (y_out): the fp32 sums, the sums rounded to bf16, or those bf16 values in fp32
// (the bits of a bf16 product cast to fp32, without a pass of its own).
constexpr int BF16_OUT_FP32 = 0, BF16_OUT_BF16 = 1, BF16_OUT_ROUNDED_FP32 = 2;

extern "C" {

// y [M, N] = x [M, K] @ w^T (+ bias), w [N, K] bf16 row-major as torch keeps it (no repacking:
// oneDNN reads the same weight for big steps); x fp32 or bf16 (x_bf16), y as y_out says,
// bias fp32 [N] or null. Needs N % 16 == 0 and K % 32 == 0; products in bf16, sums in fp32.
void bf16_gemm(const void* x, int x_bf16, const uint16_t* w, const float* bias, void* y, int y_out,
               int64_t M, int64_t N, int64_t K, int num_threads);

}  // extern "C"
