// The tile body of the block-quantized linear (src/block_gemm.cpp), which linear_blocks
// (src/quant_linear.cpp) runs for steps of many tokens. Present in the amx build only.
#pragma once
#include <cstdint>

#include "isa.h"

#ifdef PAGODE_AMX
// As linear_blocks (include/quant_linear.h): each weight row's integers unpacked once and
// multiplied with every token on AMX tiles, the blocks' scales applied to the products;
// `int8`: steps of more than 8 tokens on int8 tokens (not Q8_0, and not while bf16 tokens are on).
void tile_linear(int64_t kind, const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t ldy, bool int8, int nthreads);
// Steps of more than 8 tokens in bf16 (off: exact at every size).
void set_tile_bf16(bool on);

#endif
