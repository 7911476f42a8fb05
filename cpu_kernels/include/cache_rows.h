// A paged K/V cache's rows: where position t's row of a KV head lies, and a row of each
// element type (cache_types.h) as fp32 and back. Header-only so that every kernel that reads
// or writes the cache (decode, prefill, the cache write) finds and converts rows the same
// way: fp16 by F16C's vcvtph2ps, bf16 by a 16-bit shift, int8 by kv_convert.h (value times
// the row's scale). Needs AVX2 (+ F16C).
#pragma once
#include "cache_types.h"
#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kv_convert.h"

namespace pagode {

// Position t's row of a KV head in a paged cache [blocks, BS, KVH, W]: the block the
// sequence's table names, the slot in it, the head's offset kv (row = KVH * W, W the row
// width: D, or D + 4 for an int8 row and its scale).
template <typename T>
inline const T* cache_row(const T* cache, const int32_t* table, int64_t t, int64_t BS, int64_t row, int64_t kv) {
  return cache + (static_cast<int64_t>(table[t / BS]) * BS + t % BS) * row + kv;
}

// A cache row's lines, asked for ahead of use: an attention task reads one KV head's slice of
// each position (KVH rows apart), short runs at a stride that the hardware prefetcher follows
// poorly, so without this each row's first touch waits on memory.
template <typename T>
inline void prefetch_row(const T* row, int64_t D) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < static_cast<int64_t>(row_width<T>(D) * sizeof(T)); off += 64)
    _mm_prefetch(p + off, _MM_HINT_T0);
}

// ---- a cache row as fp32 ------------------------------------------------------
inline void row_to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void row_to_float(const F16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i].bits);
}

inline void row_to_float(const BF16* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  for (; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(src[i].bits) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

inline void row_to_float(const I8* src, float* dst, int64_t n) { i8_row_to_float(src, dst, n); }

// The scale an element type's row carries beyond its values: 1 but for int8 rows.
template <typename T>
inline float row_scale(const T*, int64_t) { return 1.f; }
inline float row_scale(const I8* row, int64_t D) { return i8_scale(row, D); }

// ---- fp32 as a cache row --------------------------------------------------------
inline void row_from_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void row_from_float(const float* src, F16* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) dst[i].bits = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

inline void row_from_float(const float* src, BF16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {  // round to nearest even, as torch does
    uint32_t bits;
    std::memcpy(&bits, src + i, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) { dst[i].bits = 0x7fc0; continue; }  // NaN
    bits += 0x7fffu + ((bits >> 16) & 1u);
    dst[i].bits = static_cast<uint16_t>(bits >> 16);
  }
}

inline void row_from_float(const float* src, I8* dst, int64_t n) { float_to_i8_row(src, dst, n); }

}  // namespace pagode

#endif  // PAGODE_AVX2
