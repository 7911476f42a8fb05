// Paged decode attention and the fused RoPE + K/V cache write (src/paged_attention.cpp).
// C ABI: the ctypes binding (cpu_kernels/paged_attention.py) and the fused decode step
// (src/decode_step.cpp) call the same functions. Present from the avx2 level up.
#pragma once
#include <cstdint>

#include "cache_types.h"

extern "C" {

// query/out [B, H, D] fp32; k/v caches [NB, BS, KVH, W] (W = D, or D + 4 for int8 rows and
// their fp32 scale: cache_types.h); block_tables [B, MB]; seq_lens [B].
void paged_decode_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt,
                                const int32_t* lens, float* out, int64_t B, int64_t H, int64_t D,
                                int64_t BS, int64_t KVH, int64_t MB, float scale,
    int64_t window, float softcap, int nt);  // window 0: none; softcap 0: none
void paged_decode_attention_f16(const float* q, const pagode::F16* k, const pagode::F16* v,
                                const int32_t* bt, const int32_t* lens, float* out, int64_t B, int64_t H,
                                int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
    int64_t window, float softcap, int nt);  // window 0: none; softcap 0: none
void paged_decode_attention_bf16(const float* q, const pagode::BF16* k, const pagode::BF16* v,
                                 const int32_t* bt, const int32_t* lens, float* out, int64_t B, int64_t H,
                                 int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
    int64_t window, float softcap, int nt);  // window 0: none; softcap 0: none
void paged_decode_attention_i8(const float* q, const pagode::I8* k, const pagode::I8* v,
                               const int32_t* bt, const int32_t* lens, float* out, int64_t B, int64_t H,
                               int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
    int64_t window, float softcap, int nt);  // window 0: none; softcap 0: none

// qkv [n, stride] -> rotated queries q_out [n, H, D]; rotated keys and the values go to
// cache slots [n] (-1: not written); an int8 cache gets each row quantized with its own
// scale. Requires KVH * D <= 1024.
void rope_write_kv_f32(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                       const float* sin, float* q_out, float* kc, float* vc, const int64_t* slots,
                       int64_t n, int64_t H, int64_t KVH, int64_t D, int nt);
void rope_write_kv_f16(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                       const float* sin, float* q_out, pagode::F16* kc, pagode::F16* vc,
                       const int64_t* slots, int64_t n, int64_t H, int64_t KVH, int64_t D, int nt);
void rope_write_kv_bf16(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                        const float* sin, float* q_out, pagode::BF16* kc, pagode::BF16* vc,
                        const int64_t* slots, int64_t n, int64_t H, int64_t KVH, int64_t D, int nt);
void rope_write_kv_i8(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                      const float* sin, float* q_out, pagode::I8* kc, pagode::I8* vc,
                      const int64_t* slots, int64_t n, int64_t H, int64_t KVH, int64_t D, int nt);

}  // extern "C"
