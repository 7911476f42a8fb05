// The prefill kernel's bf16 products on AVX512-BF16 (src/prefill_attention.cpp): K and V
// tiles packed as bf16 pairs, queries and probabilities rounded to bf16, every product
// summed in fp32 by vdpbf16ps. The packers serve the AMX body too.
#pragma once
#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "cache_types.h"
#include "prefill_scratch.h"
#include "simd_vec.h"

namespace pagode::prefill {

using pagode_simd::transpose8x8;
#ifdef PAGODE_AVX512
using pagode_simd::Vec16;

// ---- bf16 products: rows as bf16 pairs ------------------------------------------
inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// A cache row as bf16 (round to nearest even; a bf16 row as it is), D % 32 == 0.
inline void row_to_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
}

inline void row_to_bf16(const F16* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(x));
  }
}

// The tile's KT rows as bf16: a bf16 cache's rows where they lie, other rows converted into
// buf; zeros past the kc real keys.
template <int64_t KT, typename T>
void bf16_rows(const T* const* rows, int64_t kc, int64_t D, uint16_t* buf, const uint16_t* zeros,
               const uint16_t** out) {
  for (int64_t j = 0; j < KT; ++j) {
    if (j >= kc) {
      out[j] = zeros;
    } else if constexpr (std::is_same<T, BF16>::value) {
      out[j] = reinterpret_cast<const uint16_t*>(rows[j]);
    } else {
      row_to_bf16(rows[j], buf + j * D, D);
      out[j] = buf + j * D;
    }
  }
}

// kp [D/2][KT]: pair p of key j's row (its elements 2p, 2p+1) at kp[p * KT + j].
template <int64_t KT, typename T>
void pack_k_pairs(Scratch& sc, const T* const* rows, int64_t kc, int64_t D, uint32_t* dst) {
  const uint16_t* bf[KT];
  bf16_rows<KT>(rows, kc, D, sc.kb.data(), reinterpret_cast<const uint16_t*>(sc.zeros.data()), bf);
  const float* src[KT];  // each row as D/2 32-bit pairs
  for (int64_t j = 0; j < KT; ++j) src[j] = reinterpret_cast<const float*>(bf[j]);
  float* kp = reinterpret_cast<float*>(dst);
  for (int64_t h = 0; h < KT; h += 8)
    for (int64_t p = 0; p < D / 2; p += 8) transpose8x8(src + h, p, kp + p * KT + h, KT);
}

// vp [KT/2][D]: pair (row 2i, row 2i+1) of element d at vp[i * D + d].
template <int64_t KT, typename T>
void pack_v_pairs(Scratch& sc, const T* const* rows, int64_t kc, int64_t D, uint32_t* vp) {
  const uint16_t* bf[KT];
  bf16_rows<KT>(rows, kc, D, sc.vb.data(), reinterpret_cast<const uint16_t*>(sc.zeros.data()), bf);
  for (int64_t i = 0; i < KT / 2; ++i) {
    const uint16_t *a = bf[2 * i], *b = bf[2 * i + 1];
    uint32_t* dst = vp + i * D;
    for (int64_t d = 0; d < D; d += 32) {
      const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
      // within each 128-bit lane: lo pairs elements 0-3, hi 4-7; reorder lanes to d order
      const __m512i lo = _mm512_unpacklo_epi16(x, y), hi = _mm512_unpackhi_epi16(x, y);
      const __m512i first = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
      const __m512i second = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
      _mm512_storeu_si512(dst + d, _mm512_shuffle_i64x2(first, first, _MM_SHUFFLE(3, 1, 2, 0)));
      _mm512_storeu_si512(dst + d + 16, _mm512_shuffle_i64x2(second, second, _MM_SHUFFLE(3, 1, 2, 0)));
    }
  }
}

// qbf [rows][D]: the task's queries rounded to bf16 (round to nearest even).
template <class QRow>
void queries_to_bf16(Scratch& sc, QRow qrow, int64_t n_rows, int64_t D) {
  for (int64_t r = 0; r < n_rows; ++r) row_to_bf16(qrow(r), sc.qbf.data() + r * D, D);
}

// ---- avx512 bf16 body: vdpbf16ps, key tiles of 16 (D % 32 == 0) -------------------
template <typename T>
struct Bf16Body {
  static constexpr int64_t KT = 16;
  static constexpr bool PAIRS = true;  // reads the call's PairTiles
  using Width = Vec16;

  static void begin(int64_t) {}
  static void end() {}

  template <class QRow>
  static void load_queries(Scratch& sc, QRow qrow, int64_t n_rows, int64_t D) {
    queries_to_bf16(sc, qrow, n_rows, D);
  }

  template <class QRow>
  static void scores(Scratch& sc, QRow, int64_t n_rows, int64_t D, float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    const uint32_t* kp = sc.kpp;
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const uint32_t* q = reinterpret_cast<const uint32_t*>(sc.qbf.data() + r * D);  // 4 rows of D/2 pairs
      const int64_t P = D / 2;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t p = 0; p < P; ++p) {
        const __m512bh k = as_bh(_mm512_loadu_si512(kp + p * KT));
        a0 = _mm512_dpbf16_ps(a0, as_bh(_mm512_set1_epi32(static_cast<int>(q[p]))), k);
        a1 = _mm512_dpbf16_ps(a1, as_bh(_mm512_set1_epi32(static_cast<int>(q[P + p]))), k);
        a2 = _mm512_dpbf16_ps(a2, as_bh(_mm512_set1_epi32(static_cast<int>(q[2 * P + p]))), k);
        a3 = _mm512_dpbf16_ps(a3, as_bh(_mm512_set1_epi32(static_cast<int>(q[3 * P + p]))), k);
      }
      float* s = sc.s.data() + r * KT;
      _mm512_storeu_ps(s, _mm512_mul_ps(a0, sv));
      _mm512_storeu_ps(s + KT, _mm512_mul_ps(a1, sv));
      _mm512_storeu_ps(s + 2 * KT, _mm512_mul_ps(a2, sv));
      _mm512_storeu_ps(s + 3 * KT, _mm512_mul_ps(a3, sv));
    }
    for (; r < n_rows; ++r) {
      const uint32_t* q = reinterpret_cast<const uint32_t*>(sc.qbf.data() + r * D);
      __m512 a = _mm512_setzero_ps();
      for (int64_t p = 0; p < D / 2; ++p)
        a = _mm512_dpbf16_ps(a, as_bh(_mm512_set1_epi32(static_cast<int>(q[p]))),
                             as_bh(_mm512_loadu_si512(kp + p * KT)));
      _mm512_storeu_ps(sc.s.data() + r * KT, _mm512_mul_ps(a, sv));
    }
  }

  static void accumulate(Scratch& sc, int64_t n_rows, int64_t D) {
    const uint32_t* vp = sc.vpp;
    for (int64_t r = 0; r < n_rows; ++r) {
      alignas(32) uint32_t pairs[KT / 2];  // the row's probabilities rounded to bf16, in pairs
      _mm256_store_si256(reinterpret_cast<__m256i*>(pairs),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(sc.s.data() + r * KT)));
      float* acc = sc.acc.data() + r * D;
      for (int64_t c = 0; c < D; c += 32) {
        __m512 a0 = _mm512_loadu_ps(acc + c), a1 = _mm512_loadu_ps(acc + c + 16);
        for (int64_t i = 0; i < KT / 2; ++i) {
          const __m512bh p = as_bh(_mm512_set1_epi32(static_cast<int>(pairs[i])));
          a0 = _mm512_dpbf16_ps(a0, p, as_bh(_mm512_loadu_si512(vp + i * D + c)));
          a1 = _mm512_dpbf16_ps(a1, p, as_bh(_mm512_loadu_si512(vp + i * D + c + 16)));
        }
        _mm512_storeu_ps(acc + c, a0);
        _mm512_storeu_ps(acc + c + 16, a1);
      }
    }
  }
};
#endif  // PAGODE_AVX512

}  // namespace pagode::prefill

#endif  // PAGODE_AVX2
