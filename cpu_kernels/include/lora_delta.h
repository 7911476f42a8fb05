// The low-rank deltas of adapter rows (src/lora_delta.cpp). C ABI: the ctypes binding
// (cpu_kernels/lora_delta_kernel.py) and the fused decode step call the same function.
// Present from the avx2 level up.
#pragma once
#include <cstdint>

// One projection's adapters, as an int64 table: [count, then count shards of LORA_SHARD
// values: slot, first output column, end column, rank, A, Bt, element type]. A points to
// [rank, K], Bt to [rank, end - first] (B transposed, times the adapter's scale), both fp32
// (element type LORA_F32) or bf16 (LORA_BF16).
constexpr int64_t LORA_SHARD = 7;
constexpr int64_t LORA_F32 = 0, LORA_BF16 = 1;

extern "C" {

// y [M, N] += for each row m whose slot is a shard's: (x[m] . A^T) . Bt into that shard's
// columns. x [M, K]; row_slots [M], -1 for rows on the base weights (nothing added).
void lora_add_f32(const int64_t* table, const float* x, float* y, int64_t M, int64_t K, int64_t N,
                  const int64_t* row_slots, int num_threads);

}  // extern "C"
