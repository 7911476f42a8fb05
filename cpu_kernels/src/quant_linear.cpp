// Linear layers on block-quantized weights for few tokens per step (CPU, AVX2 + OpenMP).
// (Steps of many tokens go to the tile body, src/block_gemm.cpp, where the build has AMX:
// linear_blocks switches at the weight's measured `tile_from`.)
//
// Weights are kept in llama.cpp's block formats, with the scales in separate fp16 arrays:
//   Q4_1: per block of 32 inputs, 16 bytes of nibbles (low nibble = element i, high = i + 16),
//         w = d * q + m with q in 0..15;
//   Q8_0: per block of 32 inputs, 32 int8, w = d * q.
// Activations are quantized per block of 32 to int16 with an absmax scale (x ~ dx * q, about
// 15 bits: one int8 level, llama.cpp's Q8_1, cost 5% of top-1 agreement with fp32 on real
// prose). A block's dot product is two _mm256_madd_epi16 on the weights widened to int16, and
// the scales of a row are converted and multiplied once per row, vectorised, so the inner loop
// is loads, two madds, an add, a convert and an FMA into one of two accumulators per token
// (two chains hide the FMA latency when one token runs alone). Each weight block is unpacked
// once for up to four tokens; OpenMP splits the output rows across threads.
//
// The avx512 build has its own body: a block's 32 weights widen to int16 in one zmm, and one
// AVX512-VNNI vpdpwssd (int16 x int16 pairs summed into int32) replaces the two madds and the
// add, so a block costs a load, a vpdpwssd, a convert and an FMA per token. The 32 registers
// let eight tokens share each unpacked block instead of four. It keeps the int16 activations:
// vpdpbusd (u8 x s8) would need int8 ones, llama.cpp's Q8_1, whose 5% loss of agreement is
// why this file quantizes to 15 bits. The integer block sums are the same in both bodies;
// only the order of the fp32 additions differs.
//
// llama.cpp's K-quants are computed on the file's own 256-element super-blocks, with no
// repacking: a super-block is eight sub-blocks of 32, the same width as an activation block,
// so each sub-block is one block dot as above, under a scale (and, for Q4_K/Q5_K, a minimum)
// decoded once per super-block and shared by the tokens:
//   Q4_K (144 bytes): d, dmin fp16; 12 bytes of 6-bit scales and mins; 128 nibble bytes,
//         32 bytes per pair of sub-blocks (low nibbles the first, high the second);
//   Q5_K (176 bytes): as Q4_K, plus 32 bytes whose bit j is the fifth bit of sub-block j;
//   Q6_K (210 bytes): 128 low-nibble bytes, 64 bytes of 2-bit high parts, 16 int8 scales
//         (one per 16 weights), d fp16 last. A weight times its int8 scale fits int16
//         (|(q - 32) * sc| <= 4096), so a sub-block's two scales are multiplied into the
//         widened weights and the block's float scale is d.
#include "quant_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "block_formats.h"
#include "block_gemm.h"
#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>
#endif

namespace {

using namespace block_formats;

constexpr int64_t ROW_TILE = 16;
#ifdef PAGODE_AVX512
constexpr int64_t MAX_TOKENS = 8;  // tokens that share one unpacked weight block
#else
constexpr int64_t MAX_TOKENS = 4;
#endif
constexpr int64_t PREFETCH_ROWS = 4;
// How far ahead of the block being computed its weight stream is prefetched, in bytes.
constexpr int64_t PREFETCH_BYTES = 2048;
constexpr int64_t CHUNK = 128;     // blocks whose scales are prepared at once (K up to 4096 per chunk)

// x [M, K] fp32 -> int16 per block of 32: x ~ dx * q with dx = absmax / 32767.
// xs [M, K/32] is the block's exact fp32 sum, for Q4_1's minimum term.
void quantize_activations(const float* x, int64_t M, int64_t K, int16_t* q, float* dx, float* xs) {
    const int64_t nb = K / QK;
    for (int64_t ob = 0; ob < M * nb; ++ob) {
        const float* src = x + ob * QK;
        float amax = 0.f, sum = 0.f;
        for (int i = 0; i < QK; ++i) { amax = std::fmax(amax, std::fabs(src[i])); sum += src[i]; }
        const float d = amax / 32767.f, inv = d > 0.f ? 1.f / d : 0.f;
        for (int i = 0; i < QK; ++i) q[ob * QK + i] = (int16_t)std::nearbyint(src[i] * inv);
        dx[ob] = d;
        xs[ob] = sum;
    }
}

// Per block of a row chunk: the weight scale times each token's activation scale (and, for
// Q4_1, the sum over the chunk of minimum * block sum per token).
template <int T>
void prepare_scales(const uint16_t* wd, const uint16_t* wm, const float* dx, const float* xs, int64_t nb,
                    int64_t b0, int64_t n, float comb[][CHUNK], float* mins) {
    int64_t j = 0;
#ifdef PAGODE_AVX2
    __m256 macc[T];
    for (int t = 0; t < T; ++t) macc[t] = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(wd + b0 + j)));
        for (int t = 0; t < T; ++t)
            _mm256_storeu_ps(&comb[t][j], _mm256_mul_ps(w, _mm256_loadu_ps(dx + t * nb + b0 + j)));
        if (wm == nullptr) continue;
        const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(wm + b0 + j)));
        for (int t = 0; t < T; ++t) macc[t] = _mm256_fmadd_ps(m, _mm256_loadu_ps(xs + t * nb + b0 + j), macc[t]);
    }
    if (wm != nullptr)
        for (int t = 0; t < T; ++t) {
            float lanes[8];
            _mm256_storeu_ps(lanes, macc[t]);
            for (float v : lanes) mins[t] += v;
        }
#endif
    for (; j < n; ++j) {
        const float w = half_to_float(wd[b0 + j]);
        for (int t = 0; t < T; ++t) comb[t][j] = w * dx[t * nb + b0 + j];
        if (wm == nullptr) continue;
        const float m = half_to_float(wm[b0 + j]);
        for (int t = 0; t < T; ++t) mins[t] += m * xs[t * nb + b0 + j];
    }
}


#ifdef PAGODE_AVX2
inline float hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// Sum over a block of w[i] * x[i] (8 float lanes), weights as two int16 halves of 16.
inline __m256 block_dot(__m256i w0, __m256i w1, const int16_t* x) {
    const __m256i a = _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i*)x));
    const __m256i b = _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i*)(x + 16)));
    return _mm256_cvtepi32_ps(_mm256_add_epi32(a, b));
}

struct Q4Unpack {
    static void get(const uint8_t* qs, int64_t b, __m256i& w0, __m256i& w1) {
        const __m128i raw = _mm_loadu_si128((const __m128i*)(qs + b * (QK / 2)));
        const __m128i mask = _mm_set1_epi8(0x0f);
        w0 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, mask));                     // elements 0..15
        w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), mask));  // elements 16..31
    }
#ifdef PAGODE_AVX512
    static __m512i wide(const uint8_t* qs, int64_t b) {  // elements 0..31 as int16
        const __m128i raw = _mm_loadu_si128((const __m128i*)(qs + b * (QK / 2)));
        const __m128i mask = _mm_set1_epi8(0x0f);
        return _mm512_cvtepu8_epi16(
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask)));
    }
#endif
};

struct Q8Unpack {
    static void get(const uint8_t* qs, int64_t b, __m256i& w0, __m256i& w1) {
        const int8_t* p = (const int8_t*)qs + b * QK;
        w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
        w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(p + 16)));
    }
#ifdef PAGODE_AVX512
    static __m512i wide(const uint8_t* qs, int64_t b) {
        return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)((const int8_t*)qs + b * QK)));
    }
#endif
};

#ifdef PAGODE_AVX512
// Sum over a block of w[i] * x[i] (16 float lanes): one vpdpwssd on the widened weights.
inline __m512 block_dot512(__m512i w, const int16_t* x) {
    return _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x)));
}
#endif

// The vector body of dot_row: a block's weights, their dot product with a token's block,
// scaled into an accumulator, and the accumulators' final sum.
struct Avx2Body {
    using Acc = __m256;
    struct Block { __m256i lo, hi; };
    template <typename Unpack> static Block unpack(const uint8_t* qs, int64_t b) {
        Block w;
        Unpack::get(qs, b, w.lo, w.hi);
        return w;
    }
    // A K-quant sub-block's weights as int16 (Q6_K's taken off 32 and times their int8 scales).
    template <typename KQ> static Block ksub(const uint8_t* blk, int j) {
        const __m256i b = KQ::bytes(blk, j);
        Block w{_mm256_cvtepu8_epi16(_mm256_castsi256_si128(b)), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(b, 1))};
        if constexpr (!KQ::MINS) {
            const int8_t* sc = Q6K::sc8(blk, j);
            const __m256i off = _mm256_set1_epi16(32);
            w.lo = _mm256_mullo_epi16(_mm256_sub_epi16(w.lo, off), _mm256_set1_epi16(sc[0]));
            w.hi = _mm256_mullo_epi16(_mm256_sub_epi16(w.hi, off), _mm256_set1_epi16(sc[1]));
        }
        return w;
    }
    static Acc zero() { return _mm256_setzero_ps(); }
    static Acc fma(const Block& w, const int16_t* x, const float& scale, Acc acc) {
        return _mm256_fmadd_ps(block_dot(w.lo, w.hi, x), _mm256_broadcast_ss(&scale), acc);
    }
    static float sum(Acc a, Acc b) { return hsum(_mm256_add_ps(a, b)); }
};

#ifdef PAGODE_AVX512
struct Avx512Body {
    using Acc = __m512;
    template <typename Unpack> static __m512i unpack(const uint8_t* qs, int64_t b) { return Unpack::wide(qs, b); }
    template <typename KQ> static __m512i ksub(const uint8_t* blk, int j) {
        __m512i w = _mm512_cvtepu8_epi16(KQ::bytes(blk, j));
        if constexpr (!KQ::MINS) {
            const int8_t* sc = Q6K::sc8(blk, j);
            const __m512i scale = _mm512_inserti64x4(_mm512_set1_epi16(sc[0]), _mm256_set1_epi16(sc[1]), 1);
            w = _mm512_mullo_epi16(_mm512_sub_epi16(w, _mm512_set1_epi16(32)), scale);
        }
        return w;
    }
    static Acc zero() { return _mm512_setzero_ps(); }
    static Acc fma(__m512i w, const int16_t* x, const float& scale, Acc acc) {
        return _mm512_fmadd_ps(block_dot512(w, x), _mm512_set1_ps(scale), acc);
    }
    static float sum(Acc a, Acc b) { return _mm512_reduce_add_ps(_mm512_add_ps(a, b)); }
};
using Body = Avx512Body;
#else
using Body = Avx2Body;
#endif
#endif

#ifdef PAGODE_AVX2
// Asks for the weight bytes PREFETCH_BYTES past [p, p + n) while [p, p + n) is computed. A
// thread reads its rows as one sequential stream, but a block costs many instructions per
// byte (a K-quant's most), so the out-of-order window alone reaches too few cache lines ahead
// to keep memory busy (docs/kernels.md has the measurements).
inline void stream_prefetch(const uint8_t* p, int64_t n) {
    for (int64_t off = 0; off < n; off += 64) _mm_prefetch((const char*)p + PREFETCH_BYTES + off, _MM_HINT_T0);
}
#endif

// One output row against T (<= MAX_TOKENS) quantized tokens; qs is the row's quants (Q4_1 nibbles or
// Q8_0 bytes), wm its minima (nullptr for Q8_0).
template <int T, typename Unpack, bool NIBBLES>
void dot_row(const uint8_t* qs, const uint16_t* wd, const uint16_t* wm, const int16_t* xq, const float* dx,
             const float* xs, int64_t K, float* out) {
    const int64_t nb = K / QK;
    float comb[T][CHUNK];
    float mins[T] = {};
#ifdef PAGODE_AVX2
    typename Body::Acc acc0[T], acc1[T];
    for (int t = 0; t < T; ++t) acc0[t] = acc1[t] = Body::zero();
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t n = std::min(CHUNK, nb - b0);
        prepare_scales<T>(wd, wm, dx, xs, nb, b0, n, comb, mins);
        int64_t j = 0;
        for (; j + 1 < n; j += 2) {
            stream_prefetch(qs + (b0 + j) * (NIBBLES ? QK / 2 : QK), NIBBLES ? QK : 2 * QK);
            const auto w = Body::template unpack<Unpack>(qs, b0 + j);
            const auto v = Body::template unpack<Unpack>(qs, b0 + j + 1);
            for (int t = 0; t < T; ++t) {
                const int16_t* x = xq + t * K + (b0 + j) * QK;
                acc0[t] = Body::fma(w, x, comb[t][j], acc0[t]);
                acc1[t] = Body::fma(v, x + QK, comb[t][j + 1], acc1[t]);
            }
        }
        if (j < n) {
            const auto w = Body::template unpack<Unpack>(qs, b0 + j);
            for (int t = 0; t < T; ++t) acc0[t] = Body::fma(w, xq + t * K + (b0 + j) * QK, comb[t][j], acc0[t]);
        }
    }
    for (int t = 0; t < T; ++t) out[t] = Body::sum(acc0[t], acc1[t]) + mins[t];
#else
    float total[T] = {};
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t n = std::min(CHUNK, nb - b0);
        prepare_scales<T>(wd, wm, dx, xs, nb, b0, n, comb, mins);
        for (int64_t j = 0; j < n; ++j) {
            const int64_t b = b0 + j;
            int w[QK];
            for (int i = 0; i < QK; ++i) {
                if (NIBBLES) {
                    const uint8_t byte = qs[b * (QK / 2) + (i % 16)];
                    w[i] = i < 16 ? (byte & 0x0f) : (byte >> 4);
                } else {
                    w[i] = ((const int8_t*)qs)[b * QK + i];
                }
            }
            for (int t = 0; t < T; ++t) {
                int64_t s = 0;
                for (int i = 0; i < QK; ++i) s += (int64_t)w[i] * xq[t * K + b * QK + i];
                total[t] += comb[t][j] * (float)s;
            }
        }
    }
    for (int t = 0; t < T; ++t) out[t] = total[t] + mins[t];
#endif
}

// One output row of a K-quant weight against T quantized tokens: per super-block, the
// sub-blocks' scales (times each token's activation scales) and minima are prepared once.
template <int T, typename KQ>
void dot_row_k(const uint8_t* row, const int16_t* xq, const float* dx, const float* xs, int64_t K, float* out) {
    const int64_t nb = K / QK, nsb = K / QK_K;
    float sc[SUBS], mn[SUBS], comb[T][SUBS];
#ifdef PAGODE_AVX2
    typename Body::Acc acc0[T], acc1[T];
    __m256 macc[T];  // the minima's terms, eight sub-blocks a lane, summed at the end
    for (int t = 0; t < T; ++t) {
        acc0[t] = acc1[t] = Body::zero();
        macc[t] = _mm256_setzero_ps();
    }
#else
    float total[T] = {}, mins[T] = {};
#endif
    for (int64_t s = 0; s < nsb; ++s) {
        const uint8_t* blk = row + s * KQ::BYTES;
#ifdef PAGODE_AVX2
        stream_prefetch(blk, KQ::BYTES);
#endif
        KQ::scales(blk, sc, mn);
#ifdef PAGODE_AVX2
        const __m256 scv = _mm256_loadu_ps(sc), mnv = _mm256_loadu_ps(mn);
        for (int t = 0; t < T; ++t) {
            const float *d = dx + t * nb + s * SUBS, *sum = xs + t * nb + s * SUBS;
            _mm256_storeu_ps(comb[t], _mm256_mul_ps(scv, _mm256_loadu_ps(d)));
            if (KQ::MINS) macc[t] = _mm256_fmadd_ps(mnv, _mm256_loadu_ps(sum), macc[t]);
        }
#else
        for (int t = 0; t < T; ++t) {
            const float *d = dx + t * nb + s * SUBS, *sum = xs + t * nb + s * SUBS;
            for (int j = 0; j < SUBS; ++j) {
                comb[t][j] = sc[j] * d[j];
                if (KQ::MINS) mins[t] += mn[j] * sum[j];
            }
        }
#endif
#ifdef PAGODE_AVX2
        for (int j = 0; j < SUBS; j += 2) {
            const auto w = Body::template ksub<KQ>(blk, j);
            const auto v = Body::template ksub<KQ>(blk, j + 1);
            for (int t = 0; t < T; ++t) {
                const int16_t* x = xq + t * K + (s * SUBS + j) * QK;
                acc0[t] = Body::fma(w, x, comb[t][j], acc0[t]);
                acc1[t] = Body::fma(v, x + QK, comb[t][j + 1], acc1[t]);
            }
        }
#else
        for (int j = 0; j < SUBS; ++j) {
            int w[QK];
            KQ::ints(blk, j, w);
            for (int t = 0; t < T; ++t) {
                const int16_t* x = xq + t * K + (s * SUBS + j) * QK;
                int64_t dot = 0;
                for (int i = 0; i < QK; ++i) dot += (int64_t)w[i] * x[i];
                total[t] += comb[t][j] * (float)dot;
            }
        }
#endif
    }
#ifdef PAGODE_AVX2
    for (int t = 0; t < T; ++t) out[t] = Body::sum(acc0[t], acc1[t]) + hsum(macc[t]);
#else
    for (int t = 0; t < T; ++t) out[t] = total[t] + mins[t];
#endif
}

// The row dot of each format, for block_linear: Q4_1/Q8_0 with their per-block fp16 scale
// arrays, the K-quants with the scales inside their super-blocks.
template <typename Unpack, bool NIBBLES> struct LegacyRow {
    template <int T>
    static void dot(const uint8_t* q, const uint16_t* d, const uint16_t* mn, const int16_t* xq, const float* dx,
                    const float* xs, int64_t K, float* out) {
        dot_row<T, Unpack, NIBBLES>(q, d, mn, xq, dx, xs, K, out);
    }
};
template <typename KQ> struct KRow {
    template <int T>
    static void dot(const uint8_t* q, const uint16_t*, const uint16_t*, const int16_t* xq, const float* dx,
                    const float* xs, int64_t K, float* out) {
        dot_row_k<T, KQ>(q, xq, dx, xs, K, out);
    }
};

// Asks for a later row's scales (Q4_1, Q8_0 keep them apart from the quants, which
// stream_prefetch asks for) while this one computes.
inline void prefetch_scales(const uint16_t* wd, const uint16_t* wm, int64_t nb, int64_t n, int64_t N) {
#ifdef PAGODE_AVX2
    if (n >= N) return;
    if (wd) _mm_prefetch((const char*)(wd + n * nb), _MM_HINT_T0);
    if (wm) _mm_prefetch((const char*)(wm + n * nb), _MM_HINT_T0);
#endif
}

struct Activations {
    std::vector<int16_t> q;
    std::vector<float> d, s;
    void quantize(const float* x, int64_t M, int64_t K) {
        q.resize(M * K);
        d.resize(M * (K / QK));
        s.resize(M * (K / QK));
        quantize_activations(x, M, K, q.data(), d.data(), s.data());
    }
};

// y [M, N] (rows ldy apart) = x [M, K] @ W^T (+ bias) for a weight whose row n starts at
// qs + n * row_bytes (and whose per-block scales, if the format keeps them apart, at wd + n * K/32).
template <typename Row>
void block_linear(const float* x, const uint8_t* qs, int64_t row_bytes, const uint16_t* wd, const uint16_t* wm,
                  const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t ldy, int nthreads) {
    thread_local Activations act;
    act.quantize(x, M, K);
    const int64_t nb = K / QK;
    // Pointers, not `act`: a thread_local named inside the loop would be each worker's own, empty.
    const int16_t* xq = act.q.data();
    const float *dx = act.d.data(), *xs = act.s.data();
    const int64_t tiles = (N + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t end = std::min(N, (tile + 1) * ROW_TILE);
        // Tokens outer, rows inner: the tile's weight rows and MAX_TOKENS tokens' activations stay in L1.
        for (int64_t t0 = 0; t0 < M; t0 += MAX_TOKENS) {
            const int T = (int)std::min<int64_t>(MAX_TOKENS, M - t0);
            const int16_t* xt = xq + t0 * K;
            const float *dt = dx + t0 * nb, *st = xs + t0 * nb;
            for (int64_t n = tile * ROW_TILE; n < end; ++n) {
                prefetch_scales(wd, wm, nb, n + PREFETCH_ROWS, N);
                const uint8_t* q = qs + n * row_bytes;
                const uint16_t* d = wd ? wd + n * nb : nullptr;
                const uint16_t* mn = wm ? wm + n * nb : nullptr;
                float out[MAX_TOKENS];
                switch (T) {
                    case 1: Row::template dot<1>(q, d, mn, xt, dt, st, K, out); break;
                    case 2: Row::template dot<2>(q, d, mn, xt, dt, st, K, out); break;
                    case 3: Row::template dot<3>(q, d, mn, xt, dt, st, K, out); break;
#ifdef PAGODE_AVX512
                    case 4: Row::template dot<4>(q, d, mn, xt, dt, st, K, out); break;
                    case 5: Row::template dot<5>(q, d, mn, xt, dt, st, K, out); break;
                    case 6: Row::template dot<6>(q, d, mn, xt, dt, st, K, out); break;
                    case 7: Row::template dot<7>(q, d, mn, xt, dt, st, K, out); break;
                    default: Row::template dot<8>(q, d, mn, xt, dt, st, K, out); break;
#else
                    default: Row::template dot<4>(q, d, mn, xt, dt, st, K, out); break;
#endif
                }
                const float b = bias ? bias[n] : 0.f;
                for (int t = 0; t < T; ++t) y[(t0 + t) * ldy + n] = out[t] + b;
            }
        }
    }
}

#ifndef PAGODE_AVX2
struct Q4Unpack {};
struct Q8Unpack {};
#endif

}  // namespace

extern "C" {

void linear_blocks(int64_t kind, const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                   const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t ldy, int64_t tile_from,
                   int64_t int8, int nthreads) {
#ifdef PAGODE_AMX
    if (tile_from > 0 && M >= tile_from) {
        tile_linear(kind, x, qs, wd, wm, bias, y, M, N, K, ldy, int8 != 0, nthreads);
        return;
    }
#else
    (void)tile_from;
    (void)int8;
#endif
    const int64_t super_blocks = K / QK_K;
    switch (kind) {
        case KIND_Q4_1:
            block_linear<LegacyRow<Q4Unpack, true>>(x, qs, K / 2, wd, wm, bias, y, M, N, K, ldy, nthreads);
            break;
        case KIND_Q8_0:
            block_linear<LegacyRow<Q8Unpack, false>>(x, qs, K, wd, nullptr, bias, y, M, N, K, ldy, nthreads);
            break;
        case KIND_Q4_K:
            block_linear<KRow<Q4K>>(x, qs, super_blocks * Q4K::BYTES, nullptr, nullptr, bias, y, M, N, K, ldy,
                                    nthreads);
            break;
        case KIND_Q5_K:
            block_linear<KRow<Q5K>>(x, qs, super_blocks * Q5K::BYTES, nullptr, nullptr, bias, y, M, N, K, ldy,
                                    nthreads);
            break;
        case KIND_Q6_K:
            block_linear<KRow<Q6K>>(x, qs, super_blocks * Q6K::BYTES, nullptr, nullptr, bias, y, M, N, K, ldy,
                                    nthreads);
            break;
        default:
            break;
    }
}

void quant_kernel_tile_bf16(int on) {
#ifdef PAGODE_AMX
    set_tile_bf16(on != 0);
#else
    (void)on;
#endif
}

int quant_kernel_tile_body() {
#ifdef PAGODE_AMX
    return 1;
#else
    return 0;
#endif
}

int quant_kernel_uses_avx2() {
#ifdef PAGODE_AVX2
    return 1;
#else
    return 0;
#endif
}

}  // extern "C"
