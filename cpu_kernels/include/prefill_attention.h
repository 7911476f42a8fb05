// Fused prefill/extend attention over the paged K/V cache (src/prefill_attention.cpp).
// C ABI for the ctypes binding (cpu_kernels/prefill_attention.py). Present from the avx2
// level up; the avx512 build adds its own bodies (16-wide fp32, and bf16 products on
// AVX512-BF16 dot products), the amx build bf16 products on the tile unit.
#pragma once
#include <cstdint>

#include "cache_types.h"

extern "C" {

// Chunks of new tokens packed one sequence after another: sequence s owns query rows
// q_starts[s] .. q_starts[s + 1] - 1 of q/out [T, H, D] (fp32), at positions
// seq_lens[s] - n_s .. seq_lens[s] - 1 (n_s its row count), and reads positions
// 0 .. seq_lens[s] - 1 of k/v caches [NB, BS, KVH, D] through block_tables [S, MB].
// Causal within the chunk; window 0: none (else a query at p sees keys > p - window);
// softcap 0: none (else scores become softcap * tanh(score / softcap)). D % 8 == 0.
// bf16 != 0: an fp32 or fp16 cache may take the bf16 products (queries, K/V and
// probabilities rounded to bf16, summed in fp32) where the build has them and D % 32 == 0;
// a bf16 cache takes them whatever bf16 says, an int8 cache never.
void paged_prefill_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt,
                                 const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                 int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                 int64_t window, float softcap, int bf16, int nt);
void paged_prefill_attention_f16(const float* q, const pagode::F16* k, const pagode::F16* v,
                                 const int32_t* bt, const int32_t* q_starts, const int32_t* seq_lens,
                                 float* out, int64_t S, int64_t H, int64_t D, int64_t BS, int64_t KVH,
                                 int64_t MB, float scale, int64_t window, float softcap, int bf16, int nt);
void paged_prefill_attention_bf16(const float* q, const pagode::BF16* k, const pagode::BF16* v,
                                  const int32_t* bt, const int32_t* q_starts, const int32_t* seq_lens,
                                  float* out, int64_t S, int64_t H, int64_t D, int64_t BS, int64_t KVH,
                                  int64_t MB, float scale, int64_t window, float softcap, int bf16, int nt);
// An int8 cache [NB, BS, KVH, D + 4]: each row is D int8 values and their fp32 scale
// (cache_types.h); D is still the head size.
void paged_prefill_attention_i8(const float* q, const pagode::I8* k, const pagode::I8* v,
                                const int32_t* bt, const int32_t* q_starts, const int32_t* seq_lens,
                                float* out, int64_t S, int64_t H, int64_t D, int64_t BS, int64_t KVH,
                                int64_t MB, float scale, int64_t window, float softcap, int bf16, int nt);

// Which body a call with this head size, cache element (0 fp32, 1 fp16, 2 bf16, 3 int8) and
// bf16 flag runs in this build: 1 avx2 fp32, 2 avx512 fp32, 3 avx512 bf16 dot products,
// 4 amx bf16 tiles; 0 none (D % 8 != 0).
int prefill_attention_body(int64_t D, int element, int bf16);

}  // extern "C"
