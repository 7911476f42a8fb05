// Converting one int8 K/V cache row (D int8 values, then their fp32 scale: cache_types.h)
// to and from fp32. Header-only so that every kernel reading the paged cache (decode,
// prefill, the fused step) converts rows the same way. Needs AVX2 (+ F16C); the avx512
// helpers need the avx512 level.
#pragma once
#include "cache_types.h"
#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pagode {

// The row's scale, stored after its D values.
inline float i8_scale(const I8* row, int64_t D) {
  float s;
  std::memcpy(&s, row + D, sizeof(float));
  return s;
}

// 8 int8 values as fp32, unscaled.
inline __m256 i8_load8(const I8* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// dst[0..D) = values * scale: the row as the fp32 it stands for.
inline void i8_row_to_float(const I8* row, float* dst, int64_t D) {
  const float s = i8_scale(row, D);
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(i8_load8(row + i), sv));
  for (; i < D; ++i) dst[i] = static_cast<float>(row[i].value) * s;
}

// Quantize src[0..D) into a row: scale = max |x| / 127, value = round-half-even(x / scale),
// the same arithmetic as engine/attention/kv_int8.py's quantize, so both write the same bytes.
inline void float_to_i8_row(const float* src, I8* row, int64_t D) {
  float absmax = 0.f;
  for (int64_t i = 0; i < D; ++i) absmax = std::fmax(absmax, std::fabs(src[i]));
  const float s = absmax / 127.f;
  std::memcpy(row + D, &s, sizeof(float));
  if (!(s > 0.f)) {
    for (int64_t i = 0; i < D; ++i) row[i].value = 0;
    return;
  }
  const __m256 sv = _mm256_set1_ps(s), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  int64_t i = 0;
  for (; i + 8 <= D; i += 8) {
    const __m256 x = _mm256_min_ps(_mm256_max_ps(_mm256_div_ps(_mm256_loadu_ps(src + i), sv), lo), hi);
    const __m256i q = _mm256_cvtps_epi32(x);  // the default rounding mode: to nearest, ties to even
    const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i q8 = _mm_packs_epi16(q16, q16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(row + i), q8);
  }
  for (; i < D; ++i) {
    const float x = std::fmin(std::fmax(src[i] / s, -127.f), 127.f);
    row[i].value = static_cast<int8_t>(std::nearbyint(x));
  }
}

#ifdef PAGODE_AVX512
// 16 int8 values as fp32, unscaled (the caller folds the row's scale into its sums).
inline __m512 i8_load16(const I8* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#endif  // PAGODE_AVX512

}  // namespace pagode

#endif  // PAGODE_AVX2
