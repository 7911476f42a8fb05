// Fused prefill/extend attention over the paged K/V cache, for the CPU.
// Plain C ABI, loaded with ctypes (cpu_kernels/prefill_attention.py).
//
// Why: the alternative (engine/attention/maskless_prefill.py) first gathers each
// sequence's K/V out of the paged cache into contiguous fp32 tensors, repeats them for
// every query head of a group, and then runs torch's flash kernel twice per query tile.
// This kernel reads the cache in place through the block tables and converts each K/V
// row once for all the query heads that share it.
//
// Work is split into tasks of (sequence, KV head, tile of QUERY_TILE queries): the task's
// rows are its queries times the group's query heads. It walks the keys its rows can see
// (causal, within the window) in tiles of KT keys, flash-attention style: scores of every
// row against the tile, an online softmax (running max m, running sum l, the output
// accumulator rescaled by exp(m_old - m_new) whenever the max grows), then the tile's
// values weighted by the probabilities are added. Nothing of size context x chunk is ever
// held, and the masked upper triangle costs at most one key tile per query tile.
//
// Bodies, by build level, cache element and the caller's precision:
//   avx2    fp32 FMA, key tiles of 16 (two vectors of 8): the K tile is transposed to
//           [D][16] so that a row's scores are D broadcast-FMAs per vector, with no
//           horizontal sums, and four rows share each K load.
//   avx512  the same on 16-wide vectors (key tiles of 32); and bf16 products on AVX512-BF16
//           dot products (vdpbf16ps): the K tile is packed as [D/2][16] pairs, the V tile as
//           [8][D] pairs, queries and probabilities are rounded to bf16 and every product is
//           summed in fp32.
//   amx     bf16 products on the tile unit (TDPBF16PS), key tiles of 64: the same pairs are
//           the B operands, 16 rows of queries (of probabilities) the A operand; scores and
//           the output accumulator stay fp32, the online softmax runs on vectors between the
//           two products.
// A bf16 cache always takes the bf16 products (its K/V are bf16 already, so only the
// queries and probabilities are rounded). An fp32 or fp16 cache takes them only when the
// caller asks (bf16 != 0: the engine asks where the step's projections are bf16 GEMMs
// already), its K/V rows then rounded to bf16 as they are packed; otherwise its fp32 body.
// Cache rows are converted as they are read (row_to_float, one overload per element
// type). An int8 row (D values, then its fp32 scale: cache_types.h) is dequantized to fp32
// by kv_convert.h's converter, value * scale as the torch path computes it, so the tile
// holds the very numbers the maskless path gathers; its rows are D + 4 bytes apart. An int8
// cache always takes the fp32 bodies: rounding the queries and probabilities to bf16 would
// add an error the int8 cache's decode and maskless paths do not make, so the kernel could
// no longer stand in for them exactly.
#include "prefill_attention.h"

#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "amx_tiles.h"
#include "kv_convert.h"
#include "simd_exp.h"

namespace {

using pagode::BF16;
using pagode::F16;
using pagode::I8;
using pagode::row_width;

// Queries per task (each brings its group's G query heads): the larger tile shares each
// converted K/V tile among more rows; the smaller one keeps enough tasks for every thread.
constexpr int64_t QUERY_TILE = 32, SMALL_QUERY_TILE = 16;

enum Body : int { NONE = 0, AVX2_F32 = 1, AVX512_F32 = 2, AVX512_BF16 = 3, AMX_BF16 = 4 };

// Rows of the tile unit's operands and results: the bf16 bodies pad a task's rows to it.
constexpr int64_t TILE_ROWS = 16;

// ---- cache rows as fp32 ------------------------------------------------------
inline void row_to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }

inline void row_to_float(const F16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
}

inline void row_to_float(const BF16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
}

inline void row_to_float(const I8* src, float* dst, int64_t n) { pagode::i8_row_to_float(src, dst, n); }

// Position t's row of KV head offset kv in a paged cache [blocks, BS, KVH, W] (row = KVH * W,
// W = row_width: D, or D + 4 for an int8 row and its scale).
template <typename T>
inline const T* cache_row(const T* cache, const int32_t* table, int64_t t, int64_t BS, int64_t row, int64_t kv) {
  return cache + (static_cast<int64_t>(table[t / BS]) * BS + t % BS) * row + kv;
}

// dst[c * dst_stride + r] = rows[r][col + c] for an 8 x 8 block of 32-bit values (floats,
// or bf16 pairs: the shuffles move bits, they do no arithmetic).
inline void transpose8x8(const float* const* rows, int64_t col, float* dst, int64_t dst_stride) {
  __m256 r[8], t[8], s[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i] + col);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_stride, _mm256_permute2f128_ps(s[i], s[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dst_stride, _mm256_permute2f128_ps(s[i], s[i + 4], 0x31));
  }
}

// ---- per-thread scratch, kept across calls (no allocation per step) -----------
// Rows are padded to whole tiles of TILE_ROWS; the padding rows' queries and probabilities
// are zeros, and their outputs are never read.
struct Scratch {
  std::vector<float> acc, m, l, s, kbuf, kt, vt, zeros;
  std::vector<uint16_t> qbf, kb, vb, pb;
  const uint32_t* kpp = nullptr;  // the bf16 bodies' current key tile as pairs (PairTiles)
  const uint32_t* vpp = nullptr;  // and its value tile

  // What packing a tile of KT rows into pairs needs (pack_tile).
  void prepare_packing(int64_t D, int64_t KT) {
    kb.resize(KT * D);
    vb.resize(KT * D);
    zeros.assign(D, 0.f);
  }

  void prepare(int64_t rows, int64_t D, int64_t KT) {
    const int64_t padded = (rows + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
    acc.assign(padded * D, 0.f);
    m.assign(rows, -std::numeric_limits<float>::infinity());
    l.assign(rows, 0.f);
    s.resize(padded * KT);
    kbuf.resize(KT * D);
    kt.resize(D * KT);
    vt.resize(KT * D);
    zeros.assign(D, 0.f);
    qbf.assign(padded * D, 0);
    pb.assign(padded * KT, 0);
  }
};

// ---- vector widths --------------------------------------------------------------
struct Vec8 {
  using V = __m256;
  static constexpr int64_t N = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V zero() { return _mm256_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V exp(V x) { return pagode_simd::exp256(x); }
  static float hmax(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
  }
  static float hsum(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
  }
};

#ifdef PAGODE_AVX512
struct Vec16 {
  using V = __m512;
  static constexpr int64_t N = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V zero() { return _mm512_setzero_ps(); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V exp(V x) { return pagode_simd::exp512(x); }
  static float hmax(V v) { return _mm512_reduce_max_ps(v); }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
};
#endif

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

#ifdef PAGODE_AVX512
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

#ifdef PAGODE_AMX
// ---- amx bf16 body: TDPBF16PS, key tiles of 64 (D % 32 == 0) ----------------------
// Every tile is 16 rows of 64 bytes: 16 rows x 32 bf16 (an A operand: queries over 32 of D,
// or probabilities over 32 keys), 16 pairs x 16 columns (a B operand: 32 of D x 16 keys,
// or 32 keys x 16 of D), or 16 x 16 fp32 (a result). Scores of 16 rows go to four result
// tiles (keys 0-15 .. 48-63); the probabilities are two A tiles (keys 0-31, 32-63), so that
// each load and store of the output accumulator serves two products. Tile numbers are
// reused between the two phases: all eight have the same shape.
template <typename T>
struct AmxBody {
  static constexpr int64_t KT = 64;
  static constexpr bool PAIRS = true;  // reads the call's PairTiles
  using Width = Vec16;

  static void begin(int64_t) {
    pagode_amx::TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
      cfg.rows[t] = TILE_ROWS;
      cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
  }
  static void end() { _tile_release(); }

  template <class QRow>
  static void load_queries(Scratch& sc, QRow qrow, int64_t n_rows, int64_t D) {
    queries_to_bf16(sc, qrow, n_rows, D);
  }

  // s [rows][64] = scale * q . k: per 16 rows, D / 32 query tiles, each against the four
  // key quarters' pair tiles (tiles 0-3: results, 4: queries, 5-7: keys).
  template <class QRow>
  static void scores(Scratch& sc, QRow, int64_t n_rows, int64_t D, float scale) {
    const uint32_t* kp = sc.kpp;
    for (int64_t r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < D; c += 32) {
        const uint32_t* k = kp + (c / 2) * KT;
        _tile_loadd(4, sc.qbf.data() + r0 * D + c, D * 2);
        _tile_loadd(5, k, KT * 4);
        _tile_loadd(6, k + 16, KT * 4);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, k + 32, KT * 4);
        _tile_loadd(5, k + 48, KT * 4);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 4, 5);
      }
      float* s = sc.s.data() + r0 * KT;
      _tile_stored(0, s, KT * 4);
      _tile_stored(1, s + 16, KT * 4);
      _tile_stored(2, s + 32, KT * 4);
      _tile_stored(3, s + 48, KT * 4);
    }
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < n_rows; ++r) {
      float* s = sc.s.data() + r * KT;
      for (int64_t j = 0; j < KT; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), sv));
    }
  }

  // acc [rows][D] += bf16(p) . v: per 16 rows and 32 columns of D, two blocks of the
  // accumulator (rescaled in memory by the softmax) loaded into result tiles 7 and 2, each
  // given the products of both probability tiles (4, 5) with the value pairs of keys 0-31
  // and 32-63 (tiles 6, 3, 0, 1), and stored back.
  static void accumulate(Scratch& sc, int64_t n_rows, int64_t D) {
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* s = sc.s.data() + r * KT;
      uint16_t* p = sc.pb.data() + r * KT;
      _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 16), _mm512_loadu_ps(s)));
      _mm512_storeu_si512(p + 32, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + 48), _mm512_loadu_ps(s + 32)));
    }
    const uint32_t* vp = sc.vpp;
    for (int64_t r0 = 0; r0 < n_rows; r0 += TILE_ROWS) {
      _tile_loadd(4, sc.pb.data() + r0 * KT, KT * 2);
      _tile_loadd(5, sc.pb.data() + r0 * KT + 32, KT * 2);
      float* acc = sc.acc.data() + r0 * D;
      for (int64_t c = 0; c < D; c += 32) {
        _tile_loadd(7, acc + c, D * 4);
        _tile_loadd(2, acc + c + 16, D * 4);
        _tile_loadd(6, vp + c, D * 4);
        _tile_loadd(3, vp + c + 16, D * 4);
        _tile_dpbf16ps(7, 4, 6);
        _tile_dpbf16ps(2, 4, 3);
        _tile_loadd(0, vp + 16 * D + c, D * 4);
        _tile_loadd(1, vp + 16 * D + c + 16, D * 4);
        _tile_dpbf16ps(7, 5, 0);
        _tile_dpbf16ps(2, 5, 1);
        _tile_stored(7, acc + c, D * 4);
        _tile_stored(2, acc + c + 16, D * 4);
      }
    }
  }
};
#endif  // PAGODE_AMX

// ---- the online softmax over one key tile ------------------------------------------
// Row r is query first_pos + r / G; it sees keys j0 + [jlo, jhi) of the tile: causal,
// within the window, inside the kc real keys. s becomes the row's probabilities relative
// to its new running max (0 outside what it sees); l, m and acc follow.
template <class W, int64_t KT>
void online_softmax(Scratch& sc, int64_t n_rows, int64_t G, int64_t first_pos, int64_t j0, int64_t kc,
                    int64_t window, float softcap, int64_t D) {
  using V = typename W::V;
  constexpr int64_t N = W::N;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t p = first_pos + r / G;
    const int64_t jlo = window > 0 ? std::max<int64_t>(0, p - window + 1 - j0) : 0;
    const int64_t jhi = std::min<int64_t>(kc, p - j0 + 1);
    float* s = sc.s.data() + r * KT;
    if (jlo >= jhi) {
      std::fill(s, s + KT, 0.f);
      continue;
    }
    if (softcap > 0.f) {  // Gemma 2's cap, as the decode kernel computes it
      const float inv = 1.f / softcap;
      for (int64_t j = jlo; j < jhi; ++j) s[j] = softcap * std::tanh(s[j] * inv);
    }
    const float m_old = sc.m[r];
    float m_new, sum;
    if (jlo == 0 && jhi == KT) {  // the row sees the whole tile: all in vectors
      V mx = W::load(s);
      for (int64_t j = N; j < KT; j += N) mx = W::max(mx, W::load(s + j));
      m_new = std::max(m_old, W::hmax(mx));
      const V mv = W::set1(m_new);
      V total = W::zero();
      for (int64_t j = 0; j < KT; j += N) {
        const V e = W::exp(W::sub(W::load(s + j), mv));
        W::store(s + j, e);
        total = W::add(total, e);
      }
      sum = W::hsum(total);
    } else {
      m_new = std::max(m_old, *std::max_element(s + jlo, s + jhi));
      const V mv = W::set1(m_new);
      for (int64_t j = 0; j < KT; j += N) W::store(s + j, W::exp(W::sub(W::load(s + j), mv)));
      std::fill(s, s + jlo, 0.f);
      std::fill(s + jhi, s + KT, 0.f);
      sum = 0.f;
      for (int64_t j = jlo; j < jhi; ++j) sum += s[j];
    }
    const float alpha = std::exp(m_old - m_new);  // 0 on the row's first visible tile
    sc.l[r] = sc.l[r] * alpha + sum;
    sc.m[r] = m_new;
    if (alpha != 1.f) {
      float* acc = sc.acc.data() + r * D;
      const V av = W::set1(alpha);
      for (int64_t d = 0; d < D; d += N) W::store(acc + d, W::mul(W::load(acc + d), av));
    }
  }
}

// ---- tasks ---------------------------------------------------------------------
template <typename T>
struct Args {
  const float* q;
  const T* k;
  const T* v;
  const int32_t* bt;
  const int32_t* q_starts;
  const int32_t* seq_lens;
  float* out;
  int64_t S, H, D, BS, KVH, MB;
  float scale;
  int64_t window;
  float softcap;
};

struct Task {
  int64_t seq, kvh, i0, i1;  // the task's queries are rows i0..i1-1 of sequence seq's chunk
  int64_t keys;              // how many key positions it reads (its cost, for ordering)
};

// ---- K/V as bf16 pairs, made once per call (the bf16 bodies) -----------------------
// Every query tile of a sequence reads the same K/V tiles, so the bf16 bodies convert and
// pack each tile once per call, for all of them: per sequence and KV head, the key tiles
// from the first its chunk can see (KT-aligned) to its last, each kp [D/2][KT] then
// vp [KT/2][D] (pack_k_pairs, pack_v_pairs), zeros past the sequence's last position.
struct PairTiles {
  std::vector<uint32_t> words;
  std::vector<int64_t> first, count, base;  // per sequence: first tile, tiles, index of (head 0, first tile)
  int64_t tile_words = 0, KVH = 0, total = 0;

  const uint32_t* k(int64_t s, int64_t h, int64_t t) const {
    return words.data() + (base[s] + h * count[s] + t - first[s]) * 2 * tile_words;
  }
};

template <int64_t KT, typename T>
void plan_pairs(const Args<T>& a, PairTiles& p) {
  p.tile_words = KT * a.D / 2;
  p.KVH = a.KVH;
  p.first.resize(a.S);
  p.count.resize(a.S);
  p.base.resize(a.S);
  p.total = 0;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t n = a.q_starts[s + 1] - a.q_starts[s], len = a.seq_lens[s], ctx = len - n;
    const int64_t klo = a.window > 0 ? std::max<int64_t>(0, ctx - a.window + 1) : 0;
    p.first[s] = klo / KT;
    p.count[s] = (len + KT - 1) / KT - p.first[s];
    p.base[s] = p.total;
    p.total += p.count[s] * a.KVH;
  }
  p.words.resize(p.total * 2 * p.tile_words);
}

// Tile `job` of the plan (sequence, KV head, tile in order), packed by the calling thread.
template <int64_t KT, typename T>
void pack_tile(const Args<T>& a, PairTiles& p, int64_t job, Scratch& sc) {
#ifdef PAGODE_AVX512
  const int64_t s = std::upper_bound(p.base.begin(), p.base.end(), job) - p.base.begin() - 1;
  const int64_t h = (job - p.base[s]) / p.count[s], t = p.first[s] + (job - p.base[s]) % p.count[s];
  const int64_t W = row_width<T>(a.D), row = a.KVH * W, kv = h * W;
  const int64_t kc = std::min<int64_t>(KT, a.seq_lens[s] - t * KT);
  const int32_t* table = a.bt + s * a.MB;
  uint32_t* dst = p.words.data() + job * 2 * p.tile_words;
  const T* rows[KT];
  for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.k, table, t * KT + j, a.BS, row, kv);
  pack_k_pairs<KT>(sc, rows, kc, a.D, dst);
  for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.v, table, t * KT + j, a.BS, row, kv);
  pack_v_pairs<KT>(sc, rows, kc, a.D, dst + p.tile_words);
#else
  (void)a, (void)p, (void)job, (void)sc;
#endif
}

template <class Body, typename T>
void run_task(const Args<T>& a, const Task& t, Scratch& sc, const PairTiles& pairs) {
  constexpr int64_t KT = Body::KT;
  const int64_t G = a.H / a.KVH, D = a.D, n_rows = (t.i1 - t.i0) * G;
  const int64_t q0 = a.q_starts[t.seq], n = a.q_starts[t.seq + 1] - q0, ctx = a.seq_lens[t.seq] - n;
  const int64_t W = row_width<T>(D), row = a.KVH * W, kv = t.kvh * W;
  const int32_t* table = a.bt + t.seq * a.MB;
  const int64_t base = ((q0 + t.i0) * a.H + t.kvh * G) * D;  // row r: query i0 + r / G, head kvh * G + r % G
  auto qrow = [&](int64_t r) { return a.q + base + ((r / G) * a.H + r % G) * D; };
  sc.prepare(n_rows, D, KT);
  Body::load_queries(sc, qrow, n_rows, D);
  const int64_t first = ctx + t.i0, last = ctx + t.i1 - 1;
  const int64_t klo = a.window > 0 ? std::max<int64_t>(0, first - a.window + 1) : 0;
  const T* rows[KT];
  // Packed tiles are KT-aligned: keys of the first one before klo are out of every row's
  // window, and the online softmax masks them as such.
  for (int64_t j0 = Body::PAIRS ? klo / KT * KT : klo; j0 <= last; j0 += KT) {
    const int64_t kc = std::min<int64_t>(KT, last + 1 - j0);
    if constexpr (Body::PAIRS) {
      sc.kpp = pairs.k(t.seq, t.kvh, j0 / KT);
      sc.vpp = sc.kpp + pairs.tile_words;
    } else {
      for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.k, table, j0 + j, a.BS, row, kv);
      Body::pack_k(sc, rows, kc, D);
    }
    Body::scores(sc, qrow, n_rows, D, a.scale);
    online_softmax<typename Body::Width, KT>(sc, n_rows, G, first, j0, kc, a.window, a.softcap, D);
    if constexpr (!Body::PAIRS) {
      for (int64_t j = 0; j < kc; ++j) rows[j] = cache_row(a.v, table, j0 + j, a.BS, row, kv);
      Body::pack_v(sc, rows, kc, D);
    }
    Body::accumulate(sc, n_rows, D);
  }
  for (int64_t r = 0; r < n_rows; ++r) {  // every row sees at least itself, so l > 0
    float* o = a.out + base + ((r / G) * a.H + r % G) * D;
    const __m256 inv = _mm256_set1_ps(1.f / sc.l[r]);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(sc.acc.data() + r * D + d), inv));
  }
}

// Every (sequence, KV head, query tile), the costliest first so that the dynamic schedule
// ends with the short ones.
template <typename T>
std::vector<Task> tasks_of(const Args<T>& a, int64_t tile) {
  std::vector<Task> tasks;
  for (int64_t s = 0; s < a.S; ++s) {
    const int64_t n = a.q_starts[s + 1] - a.q_starts[s], ctx = a.seq_lens[s] - n;
    for (int64_t i0 = 0; i0 < n; i0 += tile) {
      const int64_t i1 = std::min(n, i0 + tile), last = ctx + i1;
      const int64_t first = a.window > 0 ? std::max<int64_t>(0, ctx + i0 - a.window + 1) : 0;
      for (int64_t h = 0; h < a.KVH; ++h) tasks.push_back({s, h, i0, i1, last - first});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.keys > y.keys; });
  return tasks;
}

template <class Body, typename T>
void run(const Args<T>& a, int num_threads) {
  std::vector<Task> tasks = tasks_of(a, QUERY_TILE);
  if (static_cast<int64_t>(tasks.size()) < 4 * num_threads) tasks = tasks_of(a, SMALL_QUERY_TILE);
  const int64_t count = static_cast<int64_t>(tasks.size());
  static thread_local PairTiles calling_thread_pairs;  // reused across calls
  PairTiles* pairs = &calling_thread_pairs;            // the workers use the calling thread's
  if constexpr (Body::PAIRS) plan_pairs<Body::KT>(a, *pairs);
#pragma omp parallel num_threads(num_threads)
  {
    thread_local Scratch sc;
    if constexpr (Body::PAIRS) {
      sc.prepare_packing(a.D, Body::KT);
#pragma omp for schedule(static)
      for (int64_t job = 0; job < pairs->total; ++job) pack_tile<Body::KT>(a, *pairs, job, sc);
    }
    Body::begin(a.D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) run_task<Body>(a, tasks[i], sc, *pairs);
    Body::end();
  }
}

enum Element : int { E_F32 = 0, E_F16 = 1, E_BF16 = 2, E_I8 = 3 };

template <typename T>
constexpr int element_code() {
  return std::is_same<T, float>::value ? E_F32
         : std::is_same<T, F16>::value ? E_F16
         : std::is_same<T, BF16>::value ? E_BF16
                                         : E_I8;
}

// bf16: whether an fp32 or fp16 cache may take the bf16 products (a bf16 cache always does,
// an int8 one never).
int body_for(int64_t D, int element, bool bf16) {
  if (D <= 0 || D % 8 != 0) return NONE;
#ifdef PAGODE_AVX512
  const bool products = D % 32 == 0 && (element == E_BF16 || (bf16 && (element == E_F32 || element == E_F16)));
#ifdef PAGODE_AMX
  if (products) return AMX_BF16;
#endif
  if (products) return AVX512_BF16;
  if (D % 16 == 0) return AVX512_F32;
#endif
  (void)element;
  (void)bf16;
  return AVX2_F32;
}

template <typename T>
void prefill(const Args<T>& a, bool bf16, int num_threads) {
  switch (body_for(a.D, element_code<T>(), bf16)) {
    case AVX2_F32: run<Fp32Body<Vec8, T>>(a, num_threads); return;
#ifdef PAGODE_AVX512
    case AVX512_F32: run<Fp32Body<Vec16, T>>(a, num_threads); return;
    case AVX512_BF16:
      if constexpr (!std::is_same<T, I8>::value) run<Bf16Body<T>>(a, num_threads);
      return;
#endif
#ifdef PAGODE_AMX
    case AMX_BF16:
      if constexpr (!std::is_same<T, I8>::value) {
        pagode_amx::request_tiles();
        run<AmxBody<T>>(a, num_threads);
      }
      return;
#endif
    default: return;
  }
}

}  // namespace

extern "C" {

void paged_prefill_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt,
                                 const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                 int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                 int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<float>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}
void paged_prefill_attention_f16(const float* q, const F16* k, const F16* v, const int32_t* bt,
                                 const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                 int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                 int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<F16>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}
void paged_prefill_attention_bf16(const float* q, const BF16* k, const BF16* v, const int32_t* bt,
                                  const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                  int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                  int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<BF16>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}

void paged_prefill_attention_i8(const float* q, const I8* k, const I8* v, const int32_t* bt,
                                const int32_t* q_starts, const int32_t* seq_lens, float* out, int64_t S,
                                int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                                int64_t window, float softcap, int bf16, int nt) {
  prefill(Args<I8>{q, k, v, bt, q_starts, seq_lens, out, S, H, D, BS, KVH, MB, scale, window, softcap}, bf16 != 0, nt);
}

int prefill_attention_body(int64_t D, int element, int bf16) { return body_for(D, element, bf16 != 0); }

}  // extern "C"

#endif  // PAGODE_AVX2
