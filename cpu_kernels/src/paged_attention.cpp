// Paged decode attention and the fused RoPE + K/V cache write, for the CPU.
// Plain C ABI, loaded with ctypes: compiles in about a second, no torch headers.
//
// The cache may hold fp32, fp16, bf16 or int8 elements; activations are fp32. Rows of the
// cache are converted to fp32 as they are read (F16C's vcvtph2ps for fp16, a 16-bit
// shift for bf16, int8 times the row's scale: include/cache_rows.h), so an fp16 cache
// halves the bytes streamed per decode step and an int8 one nearly quarters them. An int8
// row is quantized once, when the cache write stores it (absmax / 127 per token and head).
// The bodies are AVX2 (+ F16C): below the avx2 level this file compiles to nothing. The
// avx512 build decodes with its own body (decode512) where the head size is a multiple of
// 16 up to 256: a K or V row is converted in registers (vcvtph2ps on 16 halves, a 16-bit
// shift for bf16) and used at once by every query head of its group, with no row buffer;
// the output rows stay in registers across the whole pass over V; an int8 row's scale is
// applied once to its dot product (K) or its probability (V) rather than to each element.
#include "paged_attention.h"

#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cache_rows.h"
#include "kv_convert.h"
#include "simd_exp.h"

namespace {

using pagode::BF16;
using pagode::cache_row;
using pagode::F16;
using pagode::I8;
using pagode::row_from_float;
using pagode::row_scale;
using pagode::row_to_float;
using pagode::prefetch_row;
using pagode::row_width;

// ---- decode attention ------------------------------------------------------
// The offsets of positions start .. start + L - 1's rows (cache_row's), one division a
// block rather than one a row: a row is a few dozen cycles of work, a 64-bit division as many.
inline void row_offsets(const int32_t* table, int64_t BS, int64_t row, int64_t kv, int64_t start, int64_t L,
                        int64_t* out) {
  int64_t t = 0;
  while (t < L) {
    const int64_t pos = start + t, slot = pos % BS, n = std::min(BS - slot, L - t);
    const int64_t base = (static_cast<int64_t>(table[pos / BS]) * BS + slot) * row + kv;
    for (int64_t j = 0; j < n; ++j) out[t + j] = base + j * row;
    t += n;
  }
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline void axpy(float w, const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}

// softmax in place: exp(s - max) with AVX2, then a sequential sum (the order of a plain loop).
inline void softmax(float* s, int64_t L) {
  const float m = *std::max_element(s, s + L);
  int64_t t = 0;
  const __m256 mv = _mm256_set1_ps(m);
  for (; t + 8 <= L; t += 8)
    _mm256_storeu_ps(s + t, pagode_simd::exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv)));
  for (; t < L; ++t) s[t] = std::exp(s[t] - m);
  float sum = 0.f;
  for (t = 0; t < L; ++t) sum += s[t];
  const float inv = 1.f / sum;
  for (t = 0; t < L; ++t) s[t] *= inv;
}

// Gemma 2's logit soft-cap, softcap * tanh(s / softcap), on scores already scaled; 0 = none.
inline void soft_cap(float* s, int64_t L, float softcap) {
  if (softcap <= 0.f) return;
  const float inv = 1.f / softcap;
  for (int64_t t = 0; t < L; ++t) s[t] = softcap * std::tanh(s[t] * inv);
}

// The first position a decode at the end of a sequence of L sees: a sliding window of W
// keeps the last W positions, itself included (transformers: kv > q - W); 0 = no window.
inline int64_t window_start(int64_t L, int64_t window) {
  return window > 0 && L > window ? L - window : 0;
}

constexpr int64_t ROWS_AHEAD = 16;  // cache rows prefetched ahead of the one being read

#ifdef PAGODE_AVX512
// ---- decode attention, avx512 ----------------------------------------------
// Chunk c (16 elements) of a cache row, as fp32.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const F16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 load16(const BF16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline __m512 load16(const I8* p) { return pagode::i8_load16(p); }  // unscaled: see row_scale

constexpr int64_t GROUP_TILE = 4;  // query heads whose output rows are held in registers at once

// The horizontal sums of 16 vectors, as one vector (lane i = the sum of v[i]'s lanes): a
// transposing add tree of 45 shuffles and adds, where 16 separate reductions take about 130.
inline __m512 sum16(const __m512* v) {
  __m512 w[4];
  for (int q = 0; q < 4; ++q) {
    const __m512* x = v + 4 * q;
    const __m512 s01 = _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
    const __m512 s23 = _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
    const __m512d a = _mm512_castps_pd(s01), b = _mm512_castps_pd(s23);
    // Each 128-bit lane now holds x[0..3]'s partial sums over that lane's four elements.
    w[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x44), _mm512_shuffle_f32x4(w[0], w[1], 0xEE));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x44), _mm512_shuffle_f32x4(w[2], w[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
}

// Scores of up to GROUP_TILE query heads (NV chunks of 16) against the task's L keys. Keys
// go 16 at a time: their dot products are summed across lanes together (sum16).
template <int NV, typename T>
void scores512(const float* q, int64_t D, int64_t g_count, const T* k_cache, const int64_t* rows, int64_t L,
               float scale, float* scores) {
  __m512 qv[GROUP_TILE][NV];
  for (int64_t g = 0; g < g_count; ++g)
    for (int c = 0; c < NV; ++c) qv[g][c] = _mm512_loadu_ps(q + g * D + 16 * c);
  __m512 part[GROUP_TILE][16];
  alignas(64) float scales[16];
  for (int64_t j = 0; j < std::min(ROWS_AHEAD, L); ++j) prefetch_row(k_cache + rows[j], D);
  int64_t t = 0;
  for (; t + 16 <= L; t += 16) {
    for (int j = 0; j < 16; ++j) {
      const T* k = k_cache + rows[t + j];
      if (t + j + ROWS_AHEAD < L) prefetch_row(k_cache + rows[t + j + ROWS_AHEAD], D);
      __m512 kc[NV];
      for (int c = 0; c < NV; ++c) kc[c] = load16(k + 16 * c);
      scales[j] = scale * row_scale(k, D);
      for (int64_t g = 0; g < g_count; ++g) {
        __m512 acc = _mm512_mul_ps(qv[g][0], kc[0]);
        for (int c = 1; c < NV; ++c) acc = _mm512_fmadd_ps(qv[g][c], kc[c], acc);
        part[g][j] = acc;
      }
    }
    const __m512 sv = _mm512_load_ps(scales);
    for (int64_t g = 0; g < g_count; ++g) _mm512_storeu_ps(scores + g * L + t, _mm512_mul_ps(sum16(part[g]), sv));
  }
  for (; t < L; ++t) {
    const T* k = k_cache + rows[t];
    __m512 kc[NV];
    for (int c = 0; c < NV; ++c) kc[c] = load16(k + 16 * c);
    for (int64_t g = 0; g < g_count; ++g) {
      __m512 acc = _mm512_mul_ps(qv[g][0], kc[0]);
      for (int c = 1; c < NV; ++c) acc = _mm512_fmadd_ps(qv[g][c], kc[c], acc);
      scores[g * L + t] = _mm512_reduce_add_ps(acc) * (scale * row_scale(k, D));
    }
  }
}

// out rows of up to GROUP_TILE query heads = their probabilities times the task's L values.
template <int NV, typename T>
void values512(const float* probs, int64_t g_count, const T* v_cache, const int64_t* rows, int64_t L, int64_t D,
               float* out) {
  __m512 acc[GROUP_TILE][NV];
  for (int64_t g = 0; g < g_count; ++g)
    for (int c = 0; c < NV; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < L; ++t) {
    const T* v = v_cache + rows[t];
    if (t + ROWS_AHEAD < L) prefetch_row(v_cache + rows[t + ROWS_AHEAD], D);
    __m512 vc[NV];
    for (int c = 0; c < NV; ++c) vc[c] = load16(v + 16 * c);
    const float vs = row_scale(v, D);
    for (int64_t g = 0; g < g_count; ++g) {
      const __m512 p = _mm512_set1_ps(probs[g * L + t] * vs);
      for (int c = 0; c < NV; ++c) acc[g][c] = _mm512_fmadd_ps(p, vc[c], acc[g][c]);
    }
  }
  for (int64_t g = 0; g < g_count; ++g)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(out + g * D + 16 * c, acc[g][c]);
}

template <int NV, typename T>
void decode512(const float* query, const T* k_cache, const T* v_cache, const int32_t* block_tables,
               const int32_t* seq_lens, float* out, int64_t B, int64_t H, int64_t BS, int64_t KVH,
               int64_t MB, float scale, int64_t window, float softcap, int num_threads) {
  constexpr int64_t D = 16 * NV;
  const int64_t G = H / KVH, W = row_width<T>(D), row = KVH * W;
#pragma omp parallel num_threads(num_threads)
  {
    thread_local std::vector<float> scores;
    thread_local std::vector<int64_t> rows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KVH; ++task) {
      const int64_t b = task / KVH, kv = (task % KVH) * W;
      const int64_t start = window_start(seq_lens[b], window), L = seq_lens[b] - start;
      const float* q = query + (b * H + (task % KVH) * G) * D;
      float* o = out + (b * H + (task % KVH) * G) * D;
      const int32_t* table = block_tables + b * MB;
      scores.resize(G * L);
      rows.resize(L);
      row_offsets(table, BS, row, kv, start, L, rows.data());
      for (int64_t g0 = 0; g0 < G; g0 += GROUP_TILE) {
        const int64_t n = std::min(GROUP_TILE, G - g0);
        scores512<NV>(q + g0 * D, D, n, k_cache, rows.data(), L, scale, scores.data() + g0 * L);
      }
      for (int64_t j = 0; j < std::min(ROWS_AHEAD, L); ++j) prefetch_row(v_cache + rows[j], D);  // under the softmax
      for (int64_t g = 0; g < G; ++g) {
        soft_cap(scores.data() + g * L, L, softcap);
        softmax(scores.data() + g * L, L);
      }
      for (int64_t g0 = 0; g0 < G; g0 += GROUP_TILE) {
        const int64_t n = std::min(GROUP_TILE, G - g0);
        values512<NV>(scores.data() + g0 * L, n, v_cache, rows.data(), L, D, o + g0 * D);
      }
    }
  }
}

// The avx512 body for D in {16, 32, ..., 256}; false (nothing done) for any other head size.
template <typename T>
bool dispatch512(const float* q, const T* k, const T* v, const int32_t* bt, const int32_t* lens, float* out,
                 int64_t B, int64_t H, int64_t D, int64_t BS, int64_t KVH, int64_t MB, float scale,
                 int64_t window, float softcap, int nt) {
  switch (D) {
    case 16: decode512<1>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 32: decode512<2>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 48: decode512<3>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 64: decode512<4>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 80: decode512<5>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 96: decode512<6>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 128: decode512<8>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    case 256: decode512<16>(q, k, v, bt, lens, out, B, H, BS, KVH, MB, scale, window, softcap, nt); return true;
    default: return false;
  }
}
#endif  // PAGODE_AVX512

// One task per (sequence, KV head): the task's query heads share each K/V row it converts
// once, each row of the cache is streamed once in all, and a lone sequence still spreads
// over the threads (one decode at a time is the common case).
template <typename T>
void decode(const float* query, const T* k_cache, const T* v_cache, const int32_t* block_tables,
            const int32_t* seq_lens, float* out, int64_t B, int64_t H, int64_t D, int64_t BS,
            int64_t KVH, int64_t MB, float scale, int64_t window, float softcap, int num_threads) {
#ifdef PAGODE_AVX512
  if (dispatch512(query, k_cache, v_cache, block_tables, seq_lens, out, B, H, D, BS, KVH, MB, scale, window,
                  softcap, num_threads))
    return;
#endif
  const int64_t G = H / KVH, W = row_width<T>(D), row = KVH * W;
#pragma omp parallel num_threads(num_threads)
  {
    thread_local std::vector<float> scores, buf;  // kept across calls: no allocation per step
    buf.resize(D);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * KVH; ++task) {
      const int64_t b = task / KVH, kv = (task % KVH) * W;
      const int64_t start = window_start(seq_lens[b], window), L = seq_lens[b] - start;
      const float* q = query + (b * H + (task % KVH) * G) * D;
      float* o = out + (b * H + (task % KVH) * G) * D;
      const int32_t* table = block_tables + b * MB;
      scores.resize(G * L);
      for (int64_t t = 0; t < L; ++t) {
        if (t + ROWS_AHEAD < L) prefetch_row(cache_row(k_cache, table, start + t + ROWS_AHEAD, BS, row, kv), D);
        row_to_float(cache_row(k_cache, table, start + t, BS, row, kv), buf.data(), D);
        for (int64_t g = 0; g < G; ++g) scores[g * L + t] = dot(q + g * D, buf.data(), D) * scale;
      }
      for (int64_t g = 0; g < G; ++g) {
        soft_cap(scores.data() + g * L, L, softcap);
        softmax(scores.data() + g * L, L);
      }
      std::fill(o, o + G * D, 0.f);
      for (int64_t t = 0; t < L; ++t) {
        if (t + ROWS_AHEAD < L) prefetch_row(cache_row(v_cache, table, start + t + ROWS_AHEAD, BS, row, kv), D);
        row_to_float(cache_row(v_cache, table, start + t, BS, row, kv), buf.data(), D);
        for (int64_t g = 0; g < G; ++g) axpy(scores[g * L + t], buf.data(), o + g * D, D);
      }
    }
  }
}

// ---- RoPE + cache write ---------------------------------------------------
// Rotate-half RoPE with HF's arithmetic: (x1*cos - x2*sin, x2*cos + x1*sin), no FMA.
inline void rotate(const float* __restrict x, const float* __restrict c, const float* __restrict s,
                   float* __restrict y, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i] * c[i], b = x[i + half] * s[i];
    const float e = x[i + half] * c[i], f = x[i] * s[i];
    y[i] = a - b;
    y[i + half] = e + f;
  }
}

// A token's KVH rows of D values into its cache slot: one conversion for plain element
// types, one quantization per head (each head's row has its own scale) for int8.
template <typename T>
inline void store_rows(const float* src, T* dst, int64_t KVH, int64_t D) {
  if constexpr (pagode::row_extra<T> == 0) {
    row_from_float(src, dst, KVH * D);
  } else {
    for (int64_t h = 0; h < KVH; ++h) row_from_float(src + h * D, dst + h * row_width<T>(D), D);
  }
}

// qkv [T, row_stride] holds q (H*D), k (KVH*D), v (KVH*D); q_out [T, H, D] gets the rotated
// queries; the rotated keys and the values go to cache slots (slot -1: not written).
template <typename T>
void rope_write(const float* qkv, int64_t row_stride, const int64_t* positions, const float* cos,
                const float* sin, float* q_out, T* k_cache, T* v_cache, const int64_t* slots,
                int64_t n_tokens, int64_t H, int64_t KVH, int64_t D, int num_threads) {
  const int64_t half = D / 2;
#pragma omp parallel for num_threads(num_threads) if (n_tokens > 8) schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* x = qkv + t * row_stride;
    const float* c = cos + positions[t] * half;
    const float* s = sin + positions[t] * half;
    for (int64_t h = 0; h < H; ++h) rotate(x + h * D, c, s, q_out + (t * H + h) * D, half);
    const int64_t slot = slots[t];
    if (slot < 0) continue;
    float kbuf[1024];
    const float* k = x + H * D;
    for (int64_t h = 0; h < KVH; ++h) rotate(k + h * D, c, s, kbuf + h * D, half);
    store_rows(kbuf, k_cache + slot * KVH * row_width<T>(D), KVH, D);
    store_rows(k + KVH * D, v_cache + slot * KVH * row_width<T>(D), KVH, D);
  }
}

}  // namespace

extern "C" {

// query/out [B, H, D] fp32; k_cache/v_cache [NB, BS, KVH, D]; block_tables [B, MB]; seq_lens [B].
void paged_decode_attention_f32(const float* q, const float* k, const float* v, const int32_t* bt,
                                const int32_t* lens, float* out, int64_t B, int64_t H, int64_t D,
                                int64_t BS, int64_t KVH, int64_t MB, float scale, int64_t window,
                                float softcap, int nt) {
  decode(q, k, v, bt, lens, out, B, H, D, BS, KVH, MB, scale, window, softcap, nt);
}
void paged_decode_attention_f16(const float* q, const F16* k, const F16* v, const int32_t* bt,
                                const int32_t* lens, float* out, int64_t B, int64_t H, int64_t D,
                                int64_t BS, int64_t KVH, int64_t MB, float scale, int64_t window,
                                float softcap, int nt) {
  decode(q, k, v, bt, lens, out, B, H, D, BS, KVH, MB, scale, window, softcap, nt);
}
void paged_decode_attention_bf16(const float* q, const BF16* k, const BF16* v, const int32_t* bt,
                                 const int32_t* lens, float* out, int64_t B, int64_t H, int64_t D,
                                 int64_t BS, int64_t KVH, int64_t MB, float scale, int64_t window,
                                float softcap, int nt) {
  decode(q, k, v, bt, lens, out, B, H, D, BS, KVH, MB, scale, window, softcap, nt);
}
void paged_decode_attention_i8(const float* q, const I8* k, const I8* v, const int32_t* bt,
                               const int32_t* lens, float* out, int64_t B, int64_t H, int64_t D,
                               int64_t BS, int64_t KVH, int64_t MB, float scale, int64_t window,
                               float softcap, int nt) {
  decode(q, k, v, bt, lens, out, B, H, D, BS, KVH, MB, scale, window, softcap, nt);
}

// Requires KVH * D <= 1024.
void rope_write_kv_f32(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                       const float* sin, float* q_out, float* kc, float* vc, const int64_t* slots,
                       int64_t n, int64_t H, int64_t KVH, int64_t D, int nt) {
  rope_write(qkv, stride, pos, cos, sin, q_out, kc, vc, slots, n, H, KVH, D, nt);
}
void rope_write_kv_f16(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                       const float* sin, float* q_out, F16* kc, F16* vc, const int64_t* slots,
                       int64_t n, int64_t H, int64_t KVH, int64_t D, int nt) {
  rope_write(qkv, stride, pos, cos, sin, q_out, kc, vc, slots, n, H, KVH, D, nt);
}
void rope_write_kv_bf16(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                        const float* sin, float* q_out, BF16* kc, BF16* vc, const int64_t* slots,
                        int64_t n, int64_t H, int64_t KVH, int64_t D, int nt) {
  rope_write(qkv, stride, pos, cos, sin, q_out, kc, vc, slots, n, H, KVH, D, nt);
}
void rope_write_kv_i8(const float* qkv, int64_t stride, const int64_t* pos, const float* cos,
                      const float* sin, float* q_out, I8* kc, I8* vc, const int64_t* slots,
                      int64_t n, int64_t H, int64_t KVH, int64_t D, int nt) {
  rope_write(qkv, stride, pos, cos, sin, q_out, kc, vc, slots, n, H, KVH, D, nt);
}

}  // extern "C"

#endif  // PAGODE_AVX2
