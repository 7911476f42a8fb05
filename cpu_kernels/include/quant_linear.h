// Linear layers on block-quantized weights (src/quant_linear.cpp). C ABI: the ctypes
// binding (cpu_kernels/quant_linear.py) and the fused decode step call the same function.
// Present at every level (a portable body below avx2).
#pragma once
#include <cstdint>

// The block formats, as cpu_kernels/quant_linear.py numbers them.
enum BlockKind : int64_t { KIND_Q4_1 = 0, KIND_Q8_0 = 1, KIND_Q4_K = 2, KIND_Q5_K = 3, KIND_Q6_K = 4 };

extern "C" {

// y [M, N] (rows ldy floats apart) = x [M, K] @ W^T (+ bias [N]), W [N, K] in `kind`:
//   Q4_1: qs [N, K/2] nibbles, wd and wm [N, K/32] fp16 scales and minima;
//   Q8_0: qs [N, K] int8, wd [N, K/32] fp16 scales (wm unused);
//   Q4_K, Q5_K, Q6_K: qs [N, K/256 super-blocks] in GGUF's bytes (wd, wm unused).
// Steps of at least `tile_from` tokens (0: none) run the tile body (src/block_gemm.cpp) where
// the library has one (the amx build), the others the integer body. `int8` (0 or 1): the
// tile body's steps of more than 8 tokens take the tokens rounded to int8 (every format but Q8_0).
void linear_blocks(int64_t kind, const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                   const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t ldy, int64_t tile_from,
                   int64_t int8, int nthreads);

// 1 when the tile body was compiled in (the amx level), else 0.
int quant_kernel_tile_body();

// 1 when the AVX2 body was compiled in, 0 for the portable one.
int quant_kernel_uses_avx2();

}  // extern "C"
