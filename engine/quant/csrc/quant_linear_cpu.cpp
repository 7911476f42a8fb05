// Linear layers on block-quantized weights for few tokens per step (CPU, AVX2 + OpenMP).
//
// Weights are kept in llama.cpp's block formats, with the scales in separate fp16 arrays:
//   Q4_1: per block of 32 inputs, 16 bytes of nibbles (low nibble = element i, high = i + 16),
//         w = d * q + m with q in 0..15;
//   Q8_0: per block of 32 inputs, 32 int8, w = d * q.
// Activations are quantized per block of 32 to two int8 levels (x ~ d1 q1 + d2 q2, the second
// rounding what the first left over; one level, llama.cpp's Q8_1, cost 5% of top-1 agreement
// with fp32 on real prose), so a block's dot product is two _mm256_maddubs_epi16 per token. Each weight block is unpacked
// once and used for up to four tokens; OpenMP splits the output rows across threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define PAGODE_AVX2 1
#endif

namespace {

constexpr int64_t QK = 32;
constexpr int64_t ROW_TILE = 16;

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

// x [M, K] fp32 -> two int8 levels per block of 32: x ~ d1 * q1 + d2 * q2, where q2 rounds what
// q1 left over (about 14 bits in all: one int8 level costs 5% of top-1 agreement on real prose).
// xs [M, K/32] is the block's exact fp32 sum, for Q4_1's minimum term.
void quantize_activations(const float* x, int64_t M, int64_t K, int8_t* q1, int8_t* q2, float* d1,
                          float* d2, float* xs) {
    const int64_t nb = K / QK;
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t b = 0; b < nb; ++b) {
            const float* src = x + m * K + b * QK;
            const int64_t o = m * K + b * QK, ob = m * nb + b;
            float amax = 0.f, sum = 0.f;
            for (int i = 0; i < QK; ++i) { amax = std::fmax(amax, std::fabs(src[i])); sum += src[i]; }
            const float da = amax / 127.f, ia = da > 0.f ? 1.f / da : 0.f;
            float rest[QK], rmax = 0.f;
            for (int i = 0; i < QK; ++i) {
                const float q = std::nearbyint(src[i] * ia);
                q1[o + i] = (int8_t)q;
                rest[i] = src[i] - q * da;
                rmax = std::fmax(rmax, std::fabs(rest[i]));
            }
            const float db = rmax / 127.f, ib = db > 0.f ? 1.f / db : 0.f;
            for (int i = 0; i < QK; ++i) q2[o + i] = (int8_t)std::nearbyint(rest[i] * ib);
            d1[ob] = da;
            d2[ob] = db;
            xs[ob] = sum;
        }
    }
}

#ifdef PAGODE_AVX2
inline float hsum(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// 8 int32 lanes of sum(u[i] * s[i]) for 32 unsigned and 32 signed bytes.
inline __m256 dot_u8_i8(__m256i u, __m256i s) {
    const __m256i pairs = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

inline __m256i unpack_q4(const uint8_t* qs) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)qs);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(raw, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    return _mm256_set_m128i(hi, lo);
}
#endif

// One output row of a Q4_1 weight against T (<= 4) quantized tokens.
template <int T>
void row_q4_1(const uint8_t* qs, const uint16_t* wd, const uint16_t* wm, const int8_t* x1, const int8_t* x2,
              const float* d1, const float* d2, const float* xs, int64_t K, float* out) {
    const int64_t nb = K / QK;
    float mins[T] = {};
#ifdef PAGODE_AVX2
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i q = unpack_q4(qs + b * (QK / 2));
        const float d = half_to_float(wd[b]);
        const float mn = half_to_float(wm[b]);
        for (int t = 0; t < T; ++t) {
            const int64_t o = t * K + b * QK, ob = t * nb + b;
            const __m256i a = _mm256_loadu_si256((const __m256i*)(x1 + o));
            const __m256i r = _mm256_loadu_si256((const __m256i*)(x2 + o));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * d1[ob]), dot_u8_i8(q, a), acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * d2[ob]), dot_u8_i8(q, r), acc[t]);
            mins[t] += mn * xs[ob];
        }
    }
    for (int t = 0; t < T; ++t) out[t] = hsum(acc[t]) + mins[t];
#else
    for (int t = 0; t < T; ++t) {
        float total = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = qs + b * (QK / 2);
            const int64_t o = t * K + b * QK, ob = t * nb + b;
            int sa = 0, sr = 0;
            for (int i = 0; i < QK / 2; ++i) {
                const int lo = blk[i] & 0x0f, hi = blk[i] >> 4;
                sa += lo * x1[o + i] + hi * x1[o + i + QK / 2];
                sr += lo * x2[o + i] + hi * x2[o + i + QK / 2];
            }
            const float d = half_to_float(wd[b]);
            total += d * (d1[ob] * (float)sa + d2[ob] * (float)sr);
            mins[t] += half_to_float(wm[b]) * xs[ob];
        }
        out[t] = total + mins[t];
    }
#endif
}

template <int T>
void row_q8_0(const int8_t* qs, const uint16_t* wd, const int8_t* x1, const int8_t* x2, const float* d1,
              const float* d2, int64_t K, float* out) {
    const int64_t nb = K / QK;
#ifdef PAGODE_AVX2
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i w = _mm256_loadu_si256((const __m256i*)(qs + b * QK));
        const __m256i wabs = _mm256_sign_epi8(w, w);
        const float d = half_to_float(wd[b]);
        for (int t = 0; t < T; ++t) {
            const int64_t o = t * K + b * QK, ob = t * nb + b;
            const __m256i a = _mm256_loadu_si256((const __m256i*)(x1 + o));
            const __m256i r = _mm256_loadu_si256((const __m256i*)(x2 + o));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * d1[ob]), dot_u8_i8(wabs, _mm256_sign_epi8(a, w)), acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * d2[ob]), dot_u8_i8(wabs, _mm256_sign_epi8(r, w)), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) out[t] = hsum(acc[t]);
#else
    for (int t = 0; t < T; ++t) {
        float total = 0.f;
        for (int64_t b = 0; b < nb; ++b) {
            const int64_t o = t * K + b * QK, ob = t * nb + b;
            int sa = 0, sr = 0;
            for (int i = 0; i < QK; ++i) { sa += qs[b * QK + i] * x1[o + i]; sr += qs[b * QK + i] * x2[o + i]; }
            total += half_to_float(wd[b]) * (d1[ob] * (float)sa + d2[ob] * (float)sr);
        }
        out[t] = total;
    }
#endif
}

struct Activations {
    std::vector<int8_t> q1, q2;
    std::vector<float> d1, d2, s;
    void quantize(const float* x, int64_t M, int64_t K) {
        q1.resize(M * K);
        q2.resize(M * K);
        d1.resize(M * (K / QK));
        d2.resize(M * (K / QK));
        s.resize(M * (K / QK));
        quantize_activations(x, M, K, q1.data(), q2.data(), d1.data(), d2.data(), s.data());
    }
};

// Calls row(n, t0, T, out[T]) for every row n and token group, in parallel over row tiles.
template <typename RowFn>
void for_rows(int64_t M, int64_t N, const float* bias, float* y, int nthreads, RowFn row) {
    const int64_t tiles = (N + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t tile = 0; tile < tiles; ++tile) {
        const int64_t end = std::min(N, (tile + 1) * ROW_TILE);
        // Tokens outer, rows inner: the tile's weight rows and four tokens' activations stay in L1.
        for (int64_t t0 = 0; t0 < M; t0 += 4) {
            const int T = (int)std::min<int64_t>(4, M - t0);
            for (int64_t n = tile * ROW_TILE; n < end; ++n) {
                float out[4];
                row(n, t0, T, out);
                const float b = bias ? bias[n] : 0.f;
                for (int t = 0; t < T; ++t) y[(t0 + t) * N + n] = out[t] + b;
            }
        }
    }
}

}  // namespace

extern "C" {

// y [M, N] = x [M, K] @ W^T (+ bias), W in Q4_1: qs [N, K/2], d and m [N, K/32] fp16.
void linear_q4_1(const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, int nthreads) {
    thread_local Activations act;
    act.quantize(x, M, K);
    const int64_t nb = K / QK;
    // Pointers, not `act`: a thread_local named inside the lambda would be each worker's own, empty.
    const int8_t *q1 = act.q1.data(), *q2 = act.q2.data();
    const float *d1 = act.d1.data(), *d2 = act.d2.data(), *xs = act.s.data();
    for_rows(M, N, bias, y, nthreads, [&](int64_t n, int64_t t0, int T, float* out) {
        const uint8_t* q = qs + n * (K / 2);
        const uint16_t *d = wd + n * nb, *mn = wm + n * nb;
        const int8_t *a = q1 + t0 * K, *r = q2 + t0 * K;
        const float *da = d1 + t0 * nb, *dr = d2 + t0 * nb, *st = xs + t0 * nb;
        switch (T) {
            case 1: row_q4_1<1>(q, d, mn, a, r, da, dr, st, K, out); break;
            case 2: row_q4_1<2>(q, d, mn, a, r, da, dr, st, K, out); break;
            case 3: row_q4_1<3>(q, d, mn, a, r, da, dr, st, K, out); break;
            default: row_q4_1<4>(q, d, mn, a, r, da, dr, st, K, out); break;
        }
    });
}

// y [M, N] = x [M, K] @ W^T (+ bias), W in Q8_0: qs [N, K] int8, d [N, K/32] fp16.
void linear_q8_0(const float* x, const int8_t* qs, const uint16_t* wd, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K, int nthreads) {
    thread_local Activations act;
    act.quantize(x, M, K);
    const int64_t nb = K / QK;
    const int8_t *q1 = act.q1.data(), *q2 = act.q2.data();
    const float *d1 = act.d1.data(), *d2 = act.d2.data();
    for_rows(M, N, bias, y, nthreads, [&](int64_t n, int64_t t0, int T, float* out) {
        const int8_t* q = qs + n * K;
        const uint16_t* d = wd + n * nb;
        const int8_t *a = q1 + t0 * K, *r = q2 + t0 * K;
        const float *da = d1 + t0 * nb, *dr = d2 + t0 * nb;
        switch (T) {
            case 1: row_q8_0<1>(q, d, a, r, da, dr, K, out); break;
            case 2: row_q8_0<2>(q, d, a, r, da, dr, K, out); break;
            case 3: row_q8_0<3>(q, d, a, r, da, dr, K, out); break;
            default: row_q8_0<4>(q, d, a, r, da, dr, K, out); break;
        }
    });
}

int quant_kernel_uses_avx2() {
#ifdef PAGODE_AVX2
    return 1;
#else
    return 0;
#endif
}

}  // extern "C"
