// llama.cpp's block formats as the CPU kernels read them: fp16 scales, and the K-quants'
// 256-element super-blocks decoded one 32-element sub-block at a time. Shared by the
// integer block kernel (src/quant_linear.cpp) and the AMX tile body (src/block_gemm.cpp),
// so both read the bytes the same way. `static inline`: every source gets its own copy
// to inline.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>
#endif

namespace block_formats {

constexpr int64_t QK = 32;

static inline float half_to_float(uint16_t h) {
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

// ---- K-quants: per super-block, the sub-blocks' float scales and minima, and a sub-block's
// 32 weights as integers (the scalar body) or widened to int16 lanes (the vector bodies).

constexpr int64_t QK_K = 256;
constexpr int SUBS = QK_K / QK;

// Q4_K/Q5_K's eight 6-bit scales and eight 6-bit mins, packed in 12 bytes, as sixteen bytes:
// scales in u[0..1], mins in u[2..3] (llama.cpp's word-wide unpacking of get_scale_min_k4).
static inline void scale_min_k4(const uint8_t* q, uint32_t u[4]) {
    constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    std::memcpy(u, q, 12);
    u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
    const uint32_t mins_low = u[1] & low6;
    u[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
    u[2] = mins_low;
    u[0] &= low6;
}

static inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

struct Q4K {
    static constexpr int64_t BYTES = 144;
    static constexpr bool MINS = true;
    // w = d * sc * q - dmin * m: the sub-block's scale is d * sc, its minimum -dmin * m.
    static void scales(const uint8_t* blk, float sc[SUBS], float mn[SUBS]) {
        const float d = half_to_float(load_u16(blk)), dmin = half_to_float(load_u16(blk + 2));
        uint32_t u[4];
        scale_min_k4(blk + 4, u);
#ifdef PAGODE_AVX2
        const __m256 s8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)u)));
        const __m256 m8 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(u + 2))));
        _mm256_storeu_ps(sc, _mm256_mul_ps(s8, _mm256_set1_ps(d)));
        _mm256_storeu_ps(mn, _mm256_mul_ps(m8, _mm256_set1_ps(-dmin)));
#else
        const auto* b = reinterpret_cast<const uint8_t*>(u);
        for (int j = 0; j < SUBS; ++j) {
            sc[j] = d * (float)b[j];
            mn[j] = -dmin * (float)b[8 + j];
        }
#endif
    }
    static const uint8_t* nibbles(const uint8_t* blk, int j) { return blk + 16 + 32 * (j / 2); }
    static void ints(const uint8_t* blk, int j, int w[QK]) {
        const uint8_t* q = nibbles(blk, j);
        for (int l = 0; l < QK; ++l) w[l] = (j & 1) ? (q[l] >> 4) : (q[l] & 0x0f);
    }
#ifdef PAGODE_AVX2
    static __m256i bytes(const uint8_t* blk, int j) {  // the sub-block's 32 weights, one per byte
        const __m256i raw = _mm256_loadu_si256((const __m256i*)nibbles(blk, j));
        return _mm256_and_si256((j & 1) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0f));
    }
#endif
};

struct Q5K {
    static constexpr int64_t BYTES = 176;
    static constexpr bool MINS = true;
    static void scales(const uint8_t* blk, float sc[SUBS], float mn[SUBS]) { Q4K::scales(blk, sc, mn); }
    static const uint8_t* nibbles(const uint8_t* blk, int j) { return blk + 48 + 32 * (j / 2); }
    static void ints(const uint8_t* blk, int j, int w[QK]) {
        const uint8_t *q = nibbles(blk, j), *qh = blk + 16;
        for (int l = 0; l < QK; ++l) w[l] = ((j & 1) ? (q[l] >> 4) : (q[l] & 0x0f)) | (((qh[l] >> j) & 1) << 4);
    }
#ifdef PAGODE_AVX2
    static __m256i bytes(const uint8_t* blk, int j) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)nibbles(blk, j));
        const __m256i lo = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0f));
        // Bit j of each qh byte to bit 4: a 16-bit shift keeps each byte's own bit j in its bit 0.
        const __m256i qh = _mm256_loadu_si256((const __m256i*)(blk + 16));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
#endif
};

struct Q6K {
    static constexpr int64_t BYTES = 210;
    static constexpr bool MINS = false;
    static void scales(const uint8_t* blk, float sc[SUBS], float mn[SUBS]) {
        const float d = half_to_float(load_u16(blk + 208));
        for (int j = 0; j < SUBS; ++j) { sc[j] = d; mn[j] = 0.f; }
    }
    // Sub-block j = 4h + k of half h: low nibbles from ql (k 0/1 low, 2/3 high; k odd 32 bytes
    // on), two high bits from qh at bit 2k; int8 scales sc[8h + 2k] (first 16) and sc[8h + 2k + 1].
    static const uint8_t* low(const uint8_t* blk, int j) { return blk + 64 * (j / 4) + 32 * (j & 1); }
    static const uint8_t* high(const uint8_t* blk, int j) { return blk + 128 + 32 * (j / 4); }
    static const int8_t* sc8(const uint8_t* blk, int j) {
        return (const int8_t*)(blk + 192) + 8 * (j / 4) + 2 * (j % 4);
    }
    static void ints(const uint8_t* blk, int j, int w[QK]) {
        const uint8_t *ql = low(blk, j), *qh = high(blk, j);
        const int k = j % 4, shift = (k & 2) ? 4 : 0;
        const int8_t* sc = sc8(blk, j);
        for (int l = 0; l < QK; ++l)
            w[l] = ((((ql[l] >> shift) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32) * sc[l / 16];
    }
#ifdef PAGODE_AVX2
    static __m256i bytes(const uint8_t* blk, int j) {  // q in 0..63 (the 32 is taken off in int16)
        const int k = j % 4;
        const __m256i raw = _mm256_loadu_si256((const __m256i*)low(blk, j));
        const __m256i lo = _mm256_and_si256((k & 2) ? _mm256_srli_epi16(raw, 4) : raw, _mm256_set1_epi8(0x0f));
        const __m256i qh = _mm256_loadu_si256((const __m256i*)high(blk, j));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
#endif
};

}  // namespace block_formats
