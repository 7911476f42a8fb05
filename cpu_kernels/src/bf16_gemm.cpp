// A bf16 GEMM on AMX tiles for decode steps of tens of tokens, on the weight as torch keeps it.
//
// At 9-128 tokens a step is a read of the weights: oneDNN's bf16 GEMM on a plain weight
// reads them at well under the memory's rate there, and its reordered weight cannot be
// memory-mapped from a pack (it is opaque) nor shared with the big steps that also run it.
// Here the weight is the tiles' A operand, 16 rows by 32 values loaded straight from the
// row-major matrix (a row stride of K), so nothing is repacked; the tokens are B, laid out
// once per call as pairs of values (the layout TDPBF16PS reads). Each thread takes panels of
// 32 weight rows. Up to 32 tokens, and from 65, a panel runs against 32 tokens at a time:
// four accumulator tiles of 16 rows by 16 tokens, two weight tiles, two token tiles (the
// panel comes from memory for the first 32 tokens and from cache for the rest). At 33-64
// tokens each 16 rows run against all the tokens at once (three or four accumulators), so the
// rows come from memory once. An accumulator comes out as rows by tokens and is transposed in
// registers into y's token rows.
#include "bf16_gemm.h"

#include "amx_tiles.h"
#include "isa.h"

#ifdef PAGODE_AMX
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t ROWS = 16;    // weight rows per tile
constexpr int64_t TOKENS = 16;  // tokens per tile
constexpr int64_t STEP = 32;    // values of K per tile product

// Tokens [M, K] -> [tiles][K / 2][16 tokens][2 values], bf16, zero past M.
void lay_out_tokens(const void* x, bool x_bf16, int64_t M, int64_t K, uint32_t* t, int64_t tiles) {
#pragma omp for schedule(static)
    for (int64_t m = 0; m < tiles * TOKENS; ++m) {
        uint32_t* dst = t + (m / TOKENS) * TOKENS * (K / 2) + (m % TOKENS);
        for (int64_t k = 0; k < K; k += STEP) {
            alignas(64) uint32_t pairs[16];
            if (m >= M) {
                memset(pairs, 0, sizeof(pairs));
            } else if (x_bf16) {
                memcpy(pairs, static_cast<const uint16_t*>(x) + m * K + k, sizeof(pairs));
            } else {
                const float* src = static_cast<const float*>(x) + m * K + k;
                _mm512_store_si512(pairs, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 16), _mm512_loadu_ps(src)));
            }
            for (int i = 0; i < 16; ++i) dst[(k / 2 + i) * TOKENS] = pairs[i];
        }
    }
}

// 16 rows of 16 floats transposed in place (in registers).
void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

// An accumulator [16 rows][16 tokens] (stored at `acc`) into y's rows tok0.. and columns row0..
void write_tile(const float* acc, const float* bias, void* y, int y_out, int64_t N, int64_t row0,
                int64_t tok0, int64_t M) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(acc + i * 16);
    transpose16(r);  // r[c]: token c's 16 rows
    const __m512 b = bias ? _mm512_loadu_ps(bias + row0) : _mm512_setzero_ps();
    for (int64_t c = 0; c < TOKENS && tok0 + c < M; ++c) {
        const __m512 v = _mm512_add_ps(r[c], b);
        if (y_out == BF16_OUT_FP32) {
            _mm512_storeu_ps(static_cast<float*>(y) + (tok0 + c) * N + row0, v);
            continue;
        }
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
        if (y_out == BF16_OUT_BF16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(y) + (tok0 + c) * N + row0), h);
        else  // the bf16 values widened back, as a bf16 product cast to fp32 gives them
            _mm512_storeu_si512(static_cast<float*>(y) + (tok0 + c) * N + row0,
                                _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}

const uint16_t* token_tile(const uint32_t* t, int64_t tile, int64_t K) {
    return reinterpret_cast<const uint16_t*>(t + tile * TOKENS * (K / 2));
}

// 32 weight rows (w0, w1) by 32 tokens (b0, b1; b1 unused unless two_tokens) into acc[4]:
// [rows 0-15 | rows 16-31] x [tokens 0-15 | tokens 16-31] as acc[0], acc[1], acc[2], acc[3].
void rows32_tokens32(const uint16_t* w0, const uint16_t* w1, const uint16_t* b0, const uint16_t* b1,
                     bool two_tokens, int64_t steps, int64_t ld, float (*acc)[16 * 16]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t s = 0; s < steps; ++s) {
        _tile_loadd(4, w0 + s * STEP, ld);
        _tile_loadd(5, w1 + s * STEP, ld);
        _tile_loadd(6, b0 + s * STEP * TOKENS, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        if (two_tokens) {
            _tile_loadd(7, b1 + s * STEP * TOKENS, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, acc[0], 64);
    _tile_stored(1, acc[1], 64);
    _tile_stored(2, acc[2], 64);
    _tile_stored(3, acc[3], 64);
}

// 16 weight rows by T token tiles (3 or 4) into acc[0..T-1]: the rows' tile alternates
// between tiles 4 and 7 from one step of K to the next and the tokens' between 5 and 6, so a
// load never waits on the product still reading its register.
template <int T>
void rows16_tokens(const uint16_t* w, const uint16_t* b, int64_t K, int64_t steps, int64_t ld,
                   float (*acc)[16 * 16]) {
    static_assert(T == 3 || T == 4, "fewer token tiles run rows32_tokens32");
    const int64_t tile = TOKENS * K;  // bf16 values per token tile
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    if constexpr (T > 3) _tile_zero(3);
    // The tile intrinsics take their register numbers as literals, hence a macro per register.
#define PAGODE_ROWS16_STEP(A, s)                                  \
    {                                                             \
        const uint16_t* bs = b + (s) * STEP * TOKENS;             \
        _tile_loadd(A, w + (s) * STEP, ld);                       \
        _tile_loadd(5, bs, 64);                                   \
        _tile_dpbf16ps(0, A, 5);                                  \
        _tile_loadd(6, bs + tile, 64);                            \
        _tile_dpbf16ps(1, A, 6);                                  \
        _tile_loadd(5, bs + 2 * tile, 64);                        \
        _tile_dpbf16ps(2, A, 5);                                  \
        if constexpr (T > 3) {                                    \
            _tile_loadd(6, bs + 3 * tile, 64);                    \
            _tile_dpbf16ps(3, A, 6);                              \
        }                                                         \
    }
    int64_t s = 0;
    for (; s + 1 < steps; s += 2) {
        PAGODE_ROWS16_STEP(4, s)
        PAGODE_ROWS16_STEP(7, s + 1)
    }
    if (s < steps) PAGODE_ROWS16_STEP(4, s)
#undef PAGODE_ROWS16_STEP
    _tile_stored(0, acc[0], 64);
    _tile_stored(1, acc[1], 64);
    _tile_stored(2, acc[2], 64);
    if constexpr (T > 3) _tile_stored(3, acc[3], 64);
}

}  // namespace

extern "C" void bf16_gemm(const void* x, int x_bf16, const uint16_t* w, const float* bias, void* y, int y_out,
                          int64_t M, int64_t N, int64_t K, int num_threads) {
    const int64_t tiles = (M + TOKENS - 1) / TOKENS, steps = K / STEP, panels = (N + 2 * ROWS - 1) / (2 * ROWS);
    std::vector<uint32_t> tokens(tiles * TOKENS * (K / 2));
    uint32_t* t = tokens.data();
    const int64_t ld = K * 2;  // bytes between weight rows
    pagode_amx::request_tiles();
#pragma omp parallel num_threads(num_threads)
    {
        lay_out_tokens(x, x_bf16 != 0, M, K, t, tiles);  // ends on the loop's barrier
        pagode_amx::configure_full_tiles();
        alignas(64) float acc[4][16 * 16];
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t row0 = p * 2 * ROWS;
            const bool two_rows = row0 + ROWS < N;  // N % 32 == 16 leaves a last panel of one tile
            const uint16_t* w0 = w + row0 * K;
            if (tiles == 3 || tiles == 4) {
                // 33-64 tokens: each 16 rows against all the tokens at once, so that the rows
                // come from memory once (in pairs of token tiles, the second pair would read
                // them again from cache, for a third of the step's time).
                for (int64_t half = 0; half < (two_rows ? 2 : 1); ++half) {
                    const uint16_t* wr = w0 + half * ROWS * K;
                    if (tiles == 3)
                        rows16_tokens<3>(wr, token_tile(t, 0, K), K, steps, ld, acc);
                    else
                        rows16_tokens<4>(wr, token_tile(t, 0, K), K, steps, ld, acc);
                    for (int64_t c = 0; c < tiles; ++c)
                        write_tile(acc[c], bias, y, y_out, N, row0 + half * ROWS, c * TOKENS, M);
                }
                continue;
            }
            // Otherwise the panel's 32 rows against 32 tokens at a time: from 65 tokens on, the
            // fewer tile loads per product of this block beat reading the rows once.
            const uint16_t* w1 = two_rows ? w0 + ROWS * K : w0;
            for (int64_t g = 0; g < tiles; g += 2) {
                const bool two_tokens = g + 1 < tiles;
                rows32_tokens32(w0, w1, token_tile(t, g, K), token_tile(t, two_tokens ? g + 1 : g, K), two_tokens,
                                steps, ld, acc);
                for (int h = 0; h < 4; ++h) {
                    const bool second_rows = h % 2 == 1, second_tokens = h >= 2;
                    if ((second_rows && !two_rows) || (second_tokens && !two_tokens)) continue;
                    write_tile(acc[h], bias, y, y_out, N, row0 + (second_rows ? ROWS : 0),
                               (g + (second_tokens ? 1 : 0)) * TOKENS, M);
                }
            }
        }
        _tile_release();
    }
}

#endif  // PAGODE_AMX
