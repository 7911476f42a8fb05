// Linear layers on block-quantized weights for few tokens per step (CPU, AVX2 + OpenMP).
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
#include "quant_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>
#endif

namespace {

constexpr int64_t QK = 32;
constexpr int64_t ROW_TILE = 16;
#ifdef PAGODE_AVX512
constexpr int64_t MAX_TOKENS = 8;  // tokens that share one unpacked weight block
#else
constexpr int64_t MAX_TOKENS = 4;
#endif
constexpr int64_t PREFETCH_ROWS = 4;
constexpr int64_t CHUNK = 128;     // blocks whose scales are prepared at once (K up to 4096 per chunk)

inline float half_to_float(uint16_t h) {
#ifdef PAGODE_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) { bits = sign; }
        else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; --exp; }
            bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
#endif
}

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

// Asks for a later row's quants and scales while this one computes. A row is short (288
// bytes of Q4_1 at K = 576), and the hardware prefetcher alone left the decode step's
// linears waiting on memory; four rows ahead hides that latency (docs/kernels.md).
inline void prefetch_row(const uint8_t* qs, int64_t row_bytes, const uint16_t* wd, const uint16_t* wm,
                         int64_t nb, int64_t n, int64_t N) {
#ifdef PAGODE_AVX2
    if (n >= N) return;
    const char* q = (const char*)(qs + n * row_bytes);
    for (int64_t off = 0; off < row_bytes; off += 64) _mm_prefetch(q + off, _MM_HINT_T0);
    _mm_prefetch((const char*)(wd + n * nb), _MM_HINT_T0);
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

// y [M, N] = x [M, K] @ W^T (+ bias) for a weight whose row n starts at qs + n * row_bytes.
template <typename Unpack, bool NIBBLES>
void block_linear(const float* x, const uint8_t* qs, int64_t row_bytes, const uint16_t* wd, const uint16_t* wm,
                  const float* bias, float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
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
                prefetch_row(qs, row_bytes, wd, wm, nb, n + PREFETCH_ROWS, N);
                const uint8_t* q = qs + n * row_bytes;
                const uint16_t* d = wd + n * nb;
                const uint16_t* mn = wm ? wm + n * nb : nullptr;
                float out[MAX_TOKENS];
                switch (T) {
                    case 1: dot_row<1, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
                    case 2: dot_row<2, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
                    case 3: dot_row<3, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
#ifdef PAGODE_AVX512
                    case 4: dot_row<4, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
                    case 5: dot_row<5, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
                    case 6: dot_row<6, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
                    case 7: dot_row<7, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
                    default: dot_row<8, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
#else
                    default: dot_row<4, Unpack, NIBBLES>(q, d, mn, xt, dt, st, K, out); break;
#endif
                }
                const float b = bias ? bias[n] : 0.f;
                for (int t = 0; t < T; ++t) y[(t0 + t) * N + n] = out[t] + b;
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

// y [M, N] = x [M, K] @ W^T (+ bias), W in Q4_1: qs [N, K/2], d and m [N, K/32] fp16.
void linear_q4_1(const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
    block_linear<Q4Unpack, true>(x, qs, K / 2, wd, wm, bias, y, M, N, K, nthreads);
}

// y [M, N] = x [M, K] @ W^T (+ bias), W in Q8_0: qs [N, K] int8, d [N, K/32] fp16.
void linear_q8_0(const float* x, const int8_t* qs, const uint16_t* wd, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K, int nthreads) {
    block_linear<Q8Unpack, false>(x, (const uint8_t*)qs, K, wd, nullptr, bias, y, M, N, K, nthreads);
}

int quant_kernel_uses_avx2() {
#ifdef PAGODE_AVX2
    return 1;
#else
    return 0;
#endif
}

}  // extern "C"
