// The prefill kernel's fp32 body (src/prefill_attention.cpp), one template for AVX2's and
// AVX-512's widths: each key tile's rows converted to fp32 and transposed, scores as
// broadcast FMAs over the transposed tile, the probabilities' weighted value rows added.
#pragma once
#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cache_rows.h"
#include "prefill_scratch.h"
#include "simd_vec.h"

namespace pagode::prefill {

using pagode_simd::transpose8x8;

// acc[0..D) += sum_j p[j] * vt[j][0..D) over KT rows, four vectors of the row at a time.
template <class W>
inline void add_weighted_rows(const float* p, const float* vt, int64_t KT, int64_t D, float* acc) {
  constexpr int64_t N = W::N;
  int64_t c = 0;
  for (; c + 4 * N <= D; c += 4 * N) {
    typename W::V a0 = W::load(acc + c), a1 = W::load(acc + c + N), a2 = W::load(acc + c + 2 * N),
                  a3 = W::load(acc + c + 3 * N);
    for (int64_t j = 0; j < KT; ++j) {
      const typename W::V w = W::set1(p[j]);
      const float* v = vt + j * D + c;
      a0 = W::fma(w, W::load(v), a0);
      a1 = W::fma(w, W::load(v + N), a1);
      a2 = W::fma(w, W::load(v + 2 * N), a2);
      a3 = W::fma(w, W::load(v + 3 * N), a3);
    }
    W::store(acc + c, a0);
    W::store(acc + c + N, a1);
    W::store(acc + c + 2 * N, a2);
    W::store(acc + c + 3 * N, a3);
  }
  for (; c < D; c += N) {
    typename W::V a = W::load(acc + c);
    for (int64_t j = 0; j < KT; ++j) a = W::fma(W::set1(p[j]), W::load(vt + j * D + c), a);
    W::store(acc + c, a);
  }
}

// ---- fp32 body: KT = KV vectors of keys ---------------------------------------------
template <class W, typename T, int64_t KV = 2>
struct Fp32Body {
  static constexpr int64_t N = W::N, KT = N * KV;
  static constexpr bool PAIRS = false;  // converts each tile's rows itself
  using V = typename W::V;
  using Width = W;

  static void begin(int64_t) {}
  static void end() {}

  template <class QRow>
  static void load_queries(Scratch&, QRow, int64_t, int64_t) {}

  // kt [D][KT] = the tile's K rows (zeros past kc), transposed.
  static void pack_k(Scratch& sc, const T* const* rows, int64_t kc, int64_t D) {
    const float* src[KT];
    for (int64_t j = 0; j < KT; ++j) {
      float* dst = sc.kbuf.data() + j * D;
      if (j < kc) row_to_float(rows[j], dst, D);
      else std::memset(dst, 0, D * sizeof(float));
      src[j] = dst;
    }
    for (int64_t h = 0; h < KT; h += 8)
      for (int64_t d = 0; d < D; d += 8) transpose8x8(src + h, d, sc.kt.data() + d * KT + h, KT);
  }

  // s[r][0..KT) = scale * q_r . k_j for R rows at once (R <= 4).
  template <int R, class QRow>
  static void score_rows(Scratch& sc, QRow qrow, int64_t r, int64_t D, V scale) {
    const float* q[R];
    V a[R][KV];
    for (int i = 0; i < R; ++i) {
      q[i] = qrow(r + i);
      for (int c = 0; c < KV; ++c) a[i][c] = W::zero();
    }
    const float* kt = sc.kt.data();
    for (int64_t d = 0; d < D; ++d) {
      V k[KV];
      for (int c = 0; c < KV; ++c) k[c] = W::load(kt + d * KT + c * N);
      for (int i = 0; i < R; ++i) {
        const V qv = W::set1(q[i][d]);
        for (int c = 0; c < KV; ++c) a[i][c] = W::fma(qv, k[c], a[i][c]);
      }
    }
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < KV; ++c) W::store(sc.s.data() + (r + i) * KT + c * N, W::mul(a[i][c], scale));
  }

  template <class QRow>
  static void scores(Scratch& sc, QRow qrow, int64_t n_rows, int64_t D, float scale) {
    const V sv = W::set1(scale);
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) score_rows<4>(sc, qrow, r, D, sv);
    for (; r < n_rows; ++r) score_rows<1>(sc, qrow, r, D, sv);
  }

  // vt [KT][D] = the tile's V rows (zeros past kc).
  static void pack_v(Scratch& sc, const T* const* rows, int64_t kc, int64_t D) {
    for (int64_t j = 0; j < KT; ++j) {
      float* dst = sc.vt.data() + j * D;
      if (j < kc) row_to_float(rows[j], dst, D);
      else std::memset(dst, 0, D * sizeof(float));
    }
  }

  static void accumulate(Scratch& sc, int64_t n_rows, int64_t D) {
    for (int64_t r = 0; r < n_rows; ++r)
      add_weighted_rows<W>(sc.s.data() + r * KT, sc.vt.data(), KT, D, sc.acc.data() + r * D);
  }
};

}  // namespace pagode::prefill

#endif  // PAGODE_AVX2
