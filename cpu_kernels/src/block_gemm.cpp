// Steps of many tokens on block-quantized weights, on AMX tiles, with no dense copy.
//
// Why: the integer body of the block kernel (quant_linear.cpp) spends a few instructions per
// weight and per token, so past a handful of tokens a step is bound by arithmetic, not by
// reading the weights; the dense alternative, a bf16 copy of every weight for oneDNN, holds
// four times the Q4 bytes and reads them all each step. Here each thread takes a panel of 16
// output rows and, a chunk of 256 inputs at a time, writes the rows' quantized integers as
// bf16 (exact: no level of these formats needs more than 8 significant bits) with their
// blocks' scales and minima beside them. The tile unit multiplies the integers with every
// token, one product per block (TDPBF16PS: 16 rows x 16 tokens x 32 inputs; Q6_K's scales
// cover 16 inputs, so its products are 16 deep), and each product is scaled into fp32
// accumulators:
//     acc[row][token] += scale[row] * product[row][token] + minimum[row] * sum(token's inputs)
// The tokens enter as x = hi + lo with lo = bf16(x - hi), 8 tokens' hi and lo in one
// operand: 16 significant bits, more than the integer body's int16 activations, so a step
// computes what the integer body computes, to fp32 rounding, whichever body its size picks.
// With bf16 tokens switched on (set_tile_bf16: PAGODE_TILE_BF16=1), steps of more than 8
// tokens take bf16 tokens instead, one product per block for
// 16 tokens (the tile unit is what bounds those steps), at the precision of the big-step
// GEMM's bf16 activations on weights that stay exact; and from DEQUANTIZE_FROM tokens (more
// than one token tile), where scaling
// each block's product for each token tile costs more than the products, each panel of rows
// is dequantized to bf16 once (the big-step GEMM's copy, made on the fly) and the products
// accumulate across all of K in the tiles. The weights cross memory and are unpacked once
// per call whatever the number of tokens.
//
// On a weight whose layer keeps a dense GEMM for bigger steps (the caller's `int8`), steps of
// more than 8 tokens on every format but Q8_0 take int8 tokens instead and multiply the
// weights' level bytes as they are (TDPBUSD; the section "int8 tokens" below).
//
// Only the amx build has a tile body: without tiles, the products and their scaling cost
// about what the integer body costs.
#include "block_gemm.h"

#ifdef PAGODE_AMX
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "amx_tiles.h"
#include "block_formats.h"
#include "quant_linear.h"

namespace {

using namespace block_formats;

constexpr int64_t ROWS = 16;         // a panel: one tile of weight rows
constexpr int64_t TILE_TOKENS = 16;  // the widest token tile
constexpr int64_t CHUNK_BLOCKS = 8;  // blocks of 32 unpacked at a time: one K-quant super-block
constexpr int64_t STREAM_AHEAD = 2048;  // bytes ahead of the unpacking that a row's stream is fetched
constexpr int64_t MAX_STEPS = 16;    // products of a chunk (16 for Q6_K's 16-deep ones)
// Whether steps of more than 8 tokens take bf16 tokens (and, from DEQUANTIZE_FROM, bf16
// panels): off by default, so the block kernel stays exact on its blocks at every size.
std::atomic<bool> bf16_tokens{false};
constexpr int64_t PANEL = 32;        // rows of a dequantized panel: two row tiles
// From this many tokens on (two token tiles), unpacking a panel to bf16 weights once costs
// less than scaling every block's product for every token tile (measured on Q4_K and Q6_K at
// 2048-6144 inputs, 2048-12288 outputs).
constexpr int64_t DEQUANTIZE_FROM = 17;
constexpr int64_t PANEL_STRIDE = PANEL * QK;  // bf16 between two blocks of 32 in a dequantized panel

inline __m512 iota(float first) {
    return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(first));
}

// bf16 of the 32 integers from `first` on: the table that a block's levels index (VPERMW,
// 32 lookups an instruction, where converting each level through fp32 costs several).
inline __m512i int_table(float first) {
    return (__m512i)_mm512_cvtne2ps_pbh(iota(first + 16.f), iota(first));
}

// bf16 of scale * level + minimum for the 32 levels from `first` on: a block's weights, one
// VPERMW away from its levels (the rounding of the big-step GEMM's bf16 copy).
inline __m512i level_table(float scale, float minimum, float first) {
    const __m512 s = _mm512_set1_ps(scale), m = _mm512_set1_ps(minimum);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(iota(first + 16.f), s, m), _mm512_fmadd_ps(iota(first), s, m));
}

// Per format: DEPTH, the inputs one scale covers (a product's depth); MINS, whether blocks
// have minima; and `unpack`, one row's blocks [b0, b0 + n) of 32 as bf16 integers, product t
// of the chunk at dst + t * ROWS * DEPTH, its scale and minimum at scale[t] and minimum[t]
// (the caller has offset the three by the row). A row's scales lie side by side, so a
// super-block's are stored as one vector.
struct Q4_1Ints {
    static constexpr int64_t DEPTH = 32;
    static constexpr bool MINS = true;
    static void unpack(const uint8_t* row, const uint16_t* wd, const uint16_t* wm, int64_t b0, int64_t n,
                       uint16_t* dst, float* scale, float* minimum) {
        const __m128i mask = _mm_set1_epi8(0x0f);
        const __m512i table = int_table(0.f);
        for (int64_t t = 0; t < n; ++t) {
            const int64_t b = b0 + t;
            const __m128i raw = _mm_loadu_si128((const __m128i*)(row + b * (QK / 2)));
            const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
            _mm512_storeu_si512(dst + t * ROWS * DEPTH, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(q), table));
            scale[t] = half_to_float(wd[b]);
            minimum[t] = half_to_float(wm[b]);
        }
    }
    // One row's nb blocks as bf16 weights, block b at dst + b * PANEL_STRIDE.
    static void dequant(const uint8_t* row, const uint16_t* wd, const uint16_t* wm, int64_t nb, uint16_t* dst) {
        const __m128i mask = _mm_set1_epi8(0x0f);
        for (int64_t b = 0; b < nb; ++b) {
            const __m128i raw = _mm_loadu_si128((const __m128i*)(row + b * (QK / 2)));
            const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
            const __m512i table = level_table(half_to_float(wd[b]), half_to_float(wm[b]), 0.f);
            _mm512_storeu_si512(dst + b * PANEL_STRIDE, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(q), table));
        }
    }
};

struct Q8_0Ints {
    static constexpr int64_t DEPTH = 32;
    static constexpr bool MINS = false;
    static void unpack(const uint8_t* row, const uint16_t* wd, const uint16_t*, int64_t b0, int64_t n,
                       uint16_t* dst, float* scale, float*) {
        for (int64_t t = 0; t < n; ++t) {
            const int8_t* p = (const int8_t*)row + (b0 + t) * QK;
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16))));
            _mm512_storeu_si512(dst + t * ROWS * DEPTH, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            scale[t] = half_to_float(wd[b0 + t]);
        }
    }
    static void dequant(const uint8_t* row, const uint16_t* wd, const uint16_t*, int64_t nb, uint16_t* dst) {
        for (int64_t b = 0; b < nb; ++b) {
            const int8_t* p = (const int8_t*)row + b * QK;
            const __m512 d = _mm512_set1_ps(half_to_float(wd[b]));
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16))));
            _mm512_storeu_si512(dst + b * PANEL_STRIDE, (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, d), _mm512_mul_ps(lo, d)));
        }
    }
};

// Q4_K, Q5_K: per sub-block of 32, scale d * sc and minimum -dmin * m. Q6_K: levels q - 32,
// with the scale d * sc of each half sub-block of 16. b0 and n are whole super-blocks.
template <typename KQ> struct KInts {
    static constexpr int64_t DEPTH = KQ::MINS ? 32 : 16;
    static constexpr bool MINS = KQ::MINS;
    static void unpack(const uint8_t* row, const uint16_t*, const uint16_t*, int64_t b0, int64_t n,
                       uint16_t* dst, float* scale, float* minimum) {
        const __m512i low = int_table(KQ::MINS ? 0.f : -32.f), high = int_table(0.f);
        for (int64_t s = b0 / SUBS; s < (b0 + n) / SUBS; ++s) {
            const uint8_t* blk = row + s * KQ::BYTES;
            if constexpr (KQ::MINS) {
                KQ::scales(blk, scale, minimum);
            } else {  // d times each half sub-block's int8 scale, in order
                const __m512 sc8 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 192))));
                _mm512_storeu_ps(scale, _mm512_mul_ps(sc8, _mm512_set1_ps(half_to_float(load_u16(blk + 208)))));
            }
            for (int j = 0; j < SUBS; ++j) {
                const __m512i q = _mm512_cvtepu8_epi16(KQ::bytes(blk, j));
                if constexpr (KQ::MINS) {
                    _mm512_storeu_si512(dst + j * ROWS * DEPTH, _mm512_permutexvar_epi16(q, low));
                } else {  // levels 0..63 index -32..31: the two tables of VPERMT2W
                    const __m512i v = _mm512_permutex2var_epi16(low, q, high);
                    _mm256_storeu_si256((__m256i*)(dst + 2 * j * ROWS * DEPTH), _mm512_castsi512_si256(v));
                    _mm256_storeu_si256((__m256i*)(dst + (2 * j + 1) * ROWS * DEPTH), _mm512_extracti64x4_epi64(v, 1));
                }
            }
            const int64_t products = KQ::MINS ? SUBS : 2 * SUBS;
            dst += products * ROWS * DEPTH;
            scale += products;
            minimum += products;
        }
    }
    // Q6_K's two halves of a sub-block have their own scales: a table each, blended.
    static void dequant(const uint8_t* row, const uint16_t*, const uint16_t*, int64_t nb, uint16_t* dst) {
        for (int64_t s = 0; s < nb / SUBS; ++s) {
            const uint8_t* blk = row + s * KQ::BYTES;
            float sc[SUBS], mn[SUBS];
            if constexpr (KQ::MINS) KQ::scales(blk, sc, mn);
            const float d = KQ::MINS ? 0.f : half_to_float(load_u16(blk + 208));
            for (int j = 0; j < SUBS; ++j) {
                const __m512i q = _mm512_cvtepu8_epi16(KQ::bytes(blk, j));
                __m512i v;
                if constexpr (KQ::MINS) {
                    v = _mm512_permutexvar_epi16(q, level_table(sc[j], mn[j], 0.f));
                } else {  // each half sub-block of 16 is one vector: (q - 32) * d * sc, one rounding as the tables gave
                    const int8_t* s8 = (const int8_t*)(blk + 192) + 2 * j;
                    const __m512i centred = _mm512_sub_epi16(q, _mm512_set1_epi16(32));
                    const __m512 a = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(centred))),
                                                   _mm512_set1_ps(d * (float)s8[0]));
                    const __m512 b = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(centred, 1))),
                                                   _mm512_set1_ps(d * (float)s8[1]));
                    v = (__m512i)_mm512_cvtne2ps_pbh(b, a);
                }
                _mm512_storeu_si512(dst + (s * SUBS + j) * PANEL_STRIDE, v);
            }
        }
    }
};

struct Weight {  // one block-quantized weight as linear_blocks receives it
    const uint8_t* qs;
    int64_t row_bytes;
    const uint16_t *wd, *wm;
    int64_t N, K;
};

// One chunk of a panel: the rows' integers in tile order (product t's 16 rows back to back,
// so a tile load reads one contiguous run) and each product's per-row scale and minimum.
struct Chunk {
    alignas(64) uint16_t ints[CHUNK_BLOCKS * QK * ROWS];
    alignas(64) float scale[ROWS * MAX_STEPS], minimum[ROWS * MAX_STEPS];  // [row][product]
};

// A panel of 16 rows is one contiguous run, read a little of each row at a time (a chunk),
// which the hardware prefetcher does not follow: while one panel is computed the next one's
// bytes are asked for, a slice per chunk, so that they are in cache when its turn comes.
struct NextPanel {
    const char* next;
    int64_t slice, end;
    NextPanel(const Weight& w, int64_t n0) {
        const int64_t panel_bytes = ROWS * w.row_bytes, chunks = (w.K / QK + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
        next = (const char*)(w.qs + (n0 + ROWS) * w.row_bytes);
        slice = (panel_bytes + chunks - 1) / chunks;
        end = std::max<int64_t>(0, std::min(panel_bytes, (w.N - n0 - ROWS) * w.row_bytes));
    }
    void ask(int64_t chunk) const {
        for (int64_t off = chunk * slice; off < std::min((chunk + 1) * slice, end); off += 64)
            _mm_prefetch(next + off, _MM_HINT_T0);
    }
};

// Rows n0..n0+rows-1, blocks [b0, b0 + n), into the chunk; rows past `rows` get zero scales.
// A chunk reads a little of each of 16 rows, short runs that the hardware prefetcher follows
// poorly from memory, so each run's bytes STREAM_AHEAD on (a row or two later in the panel,
// which is one contiguous run) are asked for as it is read.
template <typename Fmt, typename ChunkT>
void unpack_rows(const Weight& w, int64_t n0, int64_t rows, int64_t b0, int64_t n, ChunkT& c) {
    const int64_t nb = w.K / QK;
    const int64_t from = b0 * w.row_bytes / nb, to = (b0 + n) * w.row_bytes / nb;
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = w.qs + (n0 + r) * w.row_bytes;
        for (int64_t off = from; off < to; off += 64) _mm_prefetch((const char*)row + off + STREAM_AHEAD, _MM_HINT_T0);
        Fmt::unpack(row, w.wd ? w.wd + (n0 + r) * nb : nullptr, w.wm ? w.wm + (n0 + r) * nb : nullptr, b0, n,
                    c.ints + r * Fmt::DEPTH, c.scale + r * MAX_STEPS, c.minimum + r * MAX_STEPS);
    }
    const int64_t products = n * QK / Fmt::DEPTH;
    for (int64_t t = 0; t < products; ++t)
        for (int64_t r = rows; r < ROWS; ++r) c.scale[r * MAX_STEPS + t] = c.minimum[r * MAX_STEPS + t] = 0.f;
}

// The tokens as B operands: tile c holds `width` tokens (16, or M when fewer) as
// [K/2][width][2], so a product's B tile is DEPTH/2 rows of width * 4 contiguous bytes (a
// narrow tile for a few tokens loads only their bytes). `sums` [K/32][tiles * 16] holds each
// token's exact sum over each block of 32 inputs, for the minima.
//
// Up to 8 tokens are `paired`: hi and lo share one operand of 2M columns (hi in the first M,
// lo in the next), so a product is one tile load and one TDPBF16PS; the two halves of the
// result are added when it is written out. More tokens enter as hi alone (bf16).
struct Tokens {
    std::vector<uint16_t> hi;
    std::vector<float> sums;
    int64_t width = 0, tiles = 0, cols = 0;  // cols: a token tile's columns (2 * width when paired)
    bool paired = false;
};

constexpr int64_t PAIRED_TOKENS = TILE_TOKENS / 2;

// bf16 halves of a vector of bf16 values back to fp32 (exact).
inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

void lay_out_tokens(const float* x, int64_t M, int64_t K, Tokens& t, bool bf16) {
    t.paired = !bf16;  // exact steps pair every 8 tokens' hi and lo in one operand
    t.width = std::min(t.paired ? PAIRED_TOKENS : TILE_TOKENS, M);
    t.tiles = (M + t.width - 1) / t.width;
    t.cols = t.paired ? 2 * t.width : t.width;
    t.hi.assign(t.tiles * t.cols * K, 0);
    t.sums.assign(K / QK * t.tiles * TILE_TOKENS, 0.f);
    const int64_t stride = t.tiles * TILE_TOKENS;  // between two blocks' sums
    // A block's 32 inputs are 16 pairs; pair i lands in 32-bit column `col` of row i.
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)t.cols));
    for (int64_t m = 0; m < M; ++m) {
        const int64_t tile = m / t.width, col = m % t.width;
        auto* pairs = reinterpret_cast<uint32_t*>(t.hi.data() + tile * t.cols * K);
        const __m512i at = _mm512_add_epi32(rows, _mm512_set1_epi32((int)col));
        float* sums = t.sums.data() + tile * TILE_TOKENS + col;
        for (int64_t b = 0; b < K / QK; ++b) {
            const float* src = x + m * K + b * QK;
            const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
            const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // round to nearest even, in order
            uint32_t* block = pairs + b * (QK / 2) * t.cols;
            _mm512_i32scatter_epi32(block, at, h, 4);
            const __m512 lo_h = widen_bf16(_mm512_castsi512_si256(h)), hi_h = widen_bf16(_mm512_extracti64x4_epi64(h, 1));
            // The minima multiply the same token values as the integers do: exact when paired,
            // bf16 otherwise, so that each weight meets one rounding of the token, not two.
            if (t.paired) {
                const __m512i l = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(hi, hi_h), _mm512_sub_ps(lo, lo_h));
                _mm512_i32scatter_epi32(block + t.width, at, l, 4);
                sums[b * stride] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
            } else {
                sums[b * stride] = _mm512_reduce_add_ps(_mm512_add_ps(lo_h, hi_h));
            }
        }
    }
}

using pagode_amx::request_tiles;
using pagode_amx::TileConfig;

// Tiles 0, 1: products (16 rows x cols, fp32); 2, 3: integers (16 rows x depth); 4, 5: the
// tokens (depth / 2 input pairs x cols).
void configure_tiles(int64_t depth, int64_t cols) {
    TileConfig cfg;
    for (int t = 0; t < 6; ++t) {
        cfg.rows[t] = (uint8_t)(t >= 4 ? depth / 2 : ROWS);
        cfg.colsb[t] = (uint16_t)(t == 2 || t == 3 ? depth * 2 : cols * 4);
    }
    _tile_loadconfig(&cfg);
}

// Product s of the chunk for token tile g into result tile i (0 or 1), each with its own
// operand tiles (2 + i: the integers, 4 + i: the tokens), so that two products run in the
// tile unit without one's loads waiting on the other's reads.
#define PRODUCT(TC, TA, TB, s)                                                \
    do {                                                                      \
        const int64_t at = g * t.cols * K + (first + (s) * depth) * t.cols;   \
        _tile_loadd(TA, c.ints + (s) * ROWS * depth, depth * 2);              \
        _tile_zero(TC);                                                       \
        _tile_loadd(TB, t.hi.data() + at, t.cols * 4);                        \
        _tile_dpbf16ps(TC, TA, TB);                                           \
    } while (0)

constexpr int64_t GROUP = 2;  // products in flight at a time

// Products s0 and, if n is 2, s0 + 1 into result tiles 0 and 1, each with PRODUCT_OF.
#define ISSUE(PRODUCT_OF, s0, n)                        \
    do {                                                \
        PRODUCT_OF(0, 2, 4, (s0));                      \
        if ((n) > 1) PRODUCT_OF(1, 3, 5, (s0) + 1);     \
    } while (0)

template <typename T>
inline void store_results(int64_t n, T (*out)[ROWS][TILE_TOKENS]) {
    _tile_stored(0, out[0], 64);
    if (n > 1) _tile_stored(1, out[1], 64);
}

// Every product of a chunk (`products` of them per token tile, from input `first`) scaled
// into acc [tiles][ROWS][16]. A token tile's rows stay in registers across the chunk, and the
// tile unit computes the next group of products while the vector unit scales the last.
template <typename Fmt>
void multiply_chunk(const Chunk& c, int64_t products, int64_t first, const Tokens& t, int64_t K, float* acc,
                    float (*out)[ROWS][TILE_TOKENS]) {
    constexpr int64_t depth = Fmt::DEPTH;
    const int64_t stride = t.tiles * TILE_TOKENS;  // between two blocks' sums
    for (int64_t g = 0; g < t.tiles; ++g) {
        float* a = acc + g * ROWS * TILE_TOKENS;
        __m512 rows[ROWS];
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) rows[r] = _mm512_loadu_ps(a + r * TILE_TOKENS);
        const float* sums = t.sums.data() + (first / QK) * stride + g * TILE_TOKENS;
        int64_t done = 0, n = std::min(GROUP, products);
        ISSUE(PRODUCT, 0, n);
        store_results(n, out);
        while (done < products) {
            const int64_t next = done + n, m = std::min(GROUP, products - next);
            if (m > 0) ISSUE(PRODUCT, next, m);  // runs in the tile unit while the last group is scaled
            for (int64_t i = 0; i < n; ++i) {
                const float *sc = c.scale + done + i, *mn = c.minimum + done + i;
                __m512 x = _mm512_setzero_ps();
                if constexpr (Fmt::MINS) x = _mm512_loadu_ps(sums + (done + i) * stride);
#pragma GCC unroll 16
                for (int r = 0; r < ROWS; ++r) {
                    rows[r] = _mm512_fmadd_ps(_mm512_load_ps(out[i][r]), _mm512_set1_ps(sc[r * MAX_STEPS]), rows[r]);
                    if constexpr (Fmt::MINS) rows[r] = _mm512_fmadd_ps(x, _mm512_set1_ps(mn[r * MAX_STEPS]), rows[r]);
                }
            }
            if (m > 0) store_results(m, out);
            done = next;
            n = m;
        }
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) _mm512_storeu_ps(a + r * TILE_TOKENS, rows[r]);
    }
}
#undef PRODUCT

// One panel of 16 rows against every token, a chunk of inputs at a time, into y: the exact
// body's (Tokens, Chunk) and the int8 body's (Tokens8, Chunk8), multiply_chunk for each.
template <typename Fmt, typename TokensT, typename ChunkT, typename OutT>
void panel_product(const Weight& w, const TokensT& t, int64_t n0, int64_t rows, int64_t M, const float* bias,
                   float* y, int64_t ldy, ChunkT& c, float* acc, OutT (*out)[ROWS][TILE_TOKENS]) {
    const int64_t nb = w.K / QK;
    std::fill(acc, acc + t.tiles * ROWS * TILE_TOKENS, 0.f);
    const NextPanel next(w, n0);
    for (int64_t b0 = 0, ci = 0; b0 < nb; b0 += CHUNK_BLOCKS, ++ci) {
        const int64_t n = std::min(CHUNK_BLOCKS, nb - b0);
        next.ask(ci);
        unpack_rows<Fmt>(w, n0, rows, b0, n, c);
        multiply_chunk<Fmt>(c, n * QK / Fmt::DEPTH, b0 * QK, t, w.K, acc, out);
    }
    for (int64_t m = 0; m < M; ++m) {
        const float* a = acc + (m / t.width) * ROWS * TILE_TOKENS + m % t.width;
        const int64_t lo = t.paired ? t.width : -1;  // where a paired product's lo half lies
        for (int64_t r = 0; r < rows; ++r)
            y[m * ldy + r] = a[r * TILE_TOKENS] + (lo > 0 ? a[r * TILE_TOKENS + lo] : 0.f) + (bias ? bias[r] : 0.f);
    }
}

// From DEQUANTIZE_FROM tokens: a panel of 32 rows dequantized to bf16 whole (every block of every row),
// then each pair of token tiles multiplied against it with the products accumulating in the
// tiles across all of K: four products per four tile loads, no scaling between them.
template <typename Fmt>
void dequant_panel(const Weight& w, int64_t n0, int64_t rows, uint16_t* panel) {
    const int64_t nb = w.K / QK;
    for (int64_t r = 0; r < rows; ++r)
        Fmt::dequant(w.qs + (n0 + r) * w.row_bytes, w.wd ? w.wd + (n0 + r) * nb : nullptr,
                     w.wm ? w.wm + (n0 + r) * nb : nullptr, nb, panel + r * QK);
    for (int64_t r = rows; r < PANEL; ++r)
        for (int64_t b = 0; b < nb; ++b) std::fill_n(panel + b * PANEL_STRIDE + r * QK, QK, (uint16_t)0);
}

// Tiles 0..3: results (row tile h, token tile g) at 2g + h; 4, 5: the panel's two row tiles;
// 6, 7: two token tiles (16 input pairs x cols).
void configure_panel_tiles(int64_t cols) {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = ROWS;
        cfg.colsb[t] = (uint16_t)(t == 4 || t == 5 ? QK * 2 : cols * 4);
    }
    _tile_loadconfig(&cfg);
}

// One result tile into y: its 16 rows (those below `rows`) by its token tile's tokens.
inline void write_result(const float (*out)[TILE_TOKENS], int64_t row0, int64_t rows, int64_t tok0, int64_t toks,
                         const float* bias, float* y, int64_t ldy) {
    for (int64_t c = 0; c < toks; ++c)
        for (int64_t r = 0; r < std::min(ROWS, rows - row0); ++r)
            y[(tok0 + c) * ldy + row0 + r] = out[r][c] + (bias ? bias[row0 + r] : 0.f);
}

void multiply_panel(const uint16_t* panel, const Tokens& t, int64_t K, int64_t rows, int64_t M, const float* bias,
                    float* y, int64_t ldy, float (*out)[TILE_TOKENS]) {
    const int64_t steps = K / QK, b_stride = t.cols * 4;
    for (int64_t g = 0; g < t.tiles; g += 2) {
        const bool two = g + 1 < t.tiles;
        const uint16_t* b0 = t.hi.data() + g * t.cols * K;
        const uint16_t* b1 = b0 + t.cols * K;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t s = 0; s < steps; ++s) {
            _tile_loadd(4, panel + s * PANEL_STRIDE, QK * 2);
            _tile_loadd(5, panel + s * PANEL_STRIDE + ROWS * QK, QK * 2);
            _tile_loadd(6, b0 + s * QK * t.cols, b_stride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            if (two) {
                _tile_loadd(7, b1 + s * QK * t.cols, b_stride);
                _tile_dpbf16ps(2, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        const int64_t tok0 = g * t.width;
        _tile_stored(0, out, 64);
        write_result(out, 0, rows, tok0, std::min(t.width, M - tok0), bias, y, ldy);
        _tile_stored(1, out, 64);
        write_result(out, ROWS, rows, tok0, std::min(t.width, M - tok0), bias, y, ldy);
        if (two) {
            const int64_t tok1 = tok0 + t.width;
            _tile_stored(2, out, 64);
            write_result(out, 0, rows, tok1, std::min(t.width, M - tok1), bias, y, ldy);
            _tile_stored(3, out, 64);
            write_result(out, ROWS, rows, tok1, std::min(t.width, M - tok1), bias, y, ldy);
        }
    }
}

// y [M, N] = x @ W^T (+ bias): panels of 16 rows split across the threads.
template <typename Fmt>
void gemm(const float* x, const Weight& w, const float* bias, float* y, int64_t M, int64_t ldy, int nthreads) {
    static thread_local Tokens tokens;
    const bool bf16 = bf16_tokens.load(std::memory_order_relaxed) && M > PAIRED_TOKENS;
    lay_out_tokens(x, M, w.K, tokens, bf16);
    const Tokens* t = &tokens;  // the workers read the calling thread's layout
    const bool dequantized = bf16 && M >= DEQUANTIZE_FROM;
    const int64_t height = dequantized ? PANEL : ROWS;
    const int64_t panels = (w.N + height - 1) / height;
    request_tiles();
#pragma omp parallel num_threads(nthreads)
    {
        alignas(64) float out[GROUP][ROWS][TILE_TOKENS] = {};  // columns past the tile's width stay zero
        if (dequantized) {
            static thread_local std::vector<uint16_t> panel;
            panel.resize(w.K / QK * PANEL_STRIDE);
            configure_panel_tiles(t->cols);
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; ++p) {
                const int64_t n0 = p * PANEL, rows = std::min(PANEL, w.N - n0);
                dequant_panel<Fmt>(w, n0, rows, panel.data());
                multiply_panel(panel.data(), *t, w.K, rows, M, bias ? bias + n0 : nullptr, y + n0, ldy, out[0]);
            }
        } else {
            static thread_local Chunk chunk;
            static thread_local std::vector<float> acc;
            acc.resize(t->tiles * ROWS * TILE_TOKENS);
            configure_tiles(Fmt::DEPTH, t->cols);
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; ++p) {
                const int64_t n0 = p * ROWS, rows = std::min(ROWS, w.N - n0);
                panel_product<Fmt>(w, *t, n0, rows, M, bias ? bias + n0 : nullptr, y + n0, ldy, chunk, acc.data(), out);
            }
        }
        _tile_release();
    }
}

// ---- int8 tokens: the weights' integers as bytes, the tokens as int8, TDPBUSD ----------------
//
// Each token's inputs are quantized in blocks of 32 to int8 (scale = the block's largest
// magnitude / 127, rounded to nearest: the activations of llama.cpp's K-quant dot products,
// Q8_K, are the same kind at blocks of 256). The weights' levels need no conversion: their
// bytes (0..63) go to the tile unit as they are, 16 rows x 32 inputs (16 for
// Q6_K's half sub-blocks) per product, and each product is scaled into fp32 accumulators:
//     acc[row][token] += scale[row] * (xs[token] * product[row][token]) + minimum[row] * xsum[token]
// where xs is the token's block scale and xsum = xs * the sum of its block's ints, so the
// result is the dot product of the exact weights with the int8-rounded tokens, to fp32
// rounding. The integers cost no unpacking beyond a mask and a shift, and a product scales
// 16 tokens at once, so a step of 32 tokens costs about what reading the blocks costs.

// Per format: DEPTH, and `unpack`, one row's
// blocks [b0, b0 + n) as level bytes, product t at dst + t * ROWS * DEPTH, its scale and
// minimum at scale[t] and minimum[t] (minimum: what a level of 0 weighs, per unit of input).
struct Q4_1Bytes {
    static constexpr int64_t DEPTH = 32;
    static void unpack(const uint8_t* row, const uint16_t* wd, const uint16_t* wm, int64_t b0, int64_t n,
                        uint8_t* dst, float* scale, float* minimum) {
        const __m128i mask = _mm_set1_epi8(0x0f);
        for (int64_t t = 0; t < n; ++t) {
            const int64_t b = b0 + t;
            const __m128i raw = _mm_loadu_si128((const __m128i*)(row + b * (QK / 2)));
            _mm_storeu_si128((__m128i*)(dst + t * ROWS * DEPTH), _mm_and_si128(raw, mask));
            _mm_storeu_si128((__m128i*)(dst + t * ROWS * DEPTH + 16), _mm_and_si128(_mm_srli_epi16(raw, 4), mask));
            scale[t] = half_to_float(wd[b]);
            minimum[t] = half_to_float(wm[b]);
        }
    }
};

// Q4_K, Q5_K: per sub-block of 32, scale d * sc and minimum -dmin * m. Q6_K: levels 0..63
// weighing q - 32, the scale d * sc of each half sub-block of 16, so its minimum is -32 * scale.
template <typename KQ> struct KBytes {
    static constexpr int64_t DEPTH = KQ::MINS ? 32 : 16;
    static void unpack(const uint8_t* row, const uint16_t*, const uint16_t*, int64_t b0, int64_t n,
                        uint8_t* dst, float* scale, float* minimum) {
        for (int64_t s = b0 / SUBS; s < (b0 + n) / SUBS; ++s) {
            const uint8_t* blk = row + s * KQ::BYTES;
            if constexpr (KQ::MINS) {
                KQ::scales(blk, scale, minimum);
            } else {
                const __m512 sc8 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 192))));
                const __m512 sc = _mm512_mul_ps(sc8, _mm512_set1_ps(half_to_float(load_u16(blk + 208))));
                _mm512_storeu_ps(scale, sc);
                _mm512_storeu_ps(minimum, _mm512_mul_ps(sc, _mm512_set1_ps(-32.f)));
            }
            for (int j = 0; j < SUBS; ++j) {
                const __m256i q = KQ::bytes(blk, j);
                if constexpr (KQ::MINS) {
                    _mm256_storeu_si256((__m256i*)(dst + j * ROWS * DEPTH), q);
                } else {  // two products of 16
                    _mm_storeu_si128((__m128i*)(dst + 2 * j * ROWS * DEPTH), _mm256_castsi256_si128(q));
                    _mm_storeu_si128((__m128i*)(dst + (2 * j + 1) * ROWS * DEPTH), _mm256_extracti128_si256(q, 1));
                }
            }
            const int64_t products = KQ::MINS ? SUBS : 2 * SUBS;
            dst += products * ROWS * DEPTH;
            scale += products;
            minimum += products;
        }
    }
};

struct Chunk8 {
    alignas(64) uint8_t ints[CHUNK_BLOCKS * QK * ROWS];
    alignas(64) float scale[ROWS * MAX_STEPS], minimum[ROWS * MAX_STEPS];  // [row][product]
};

// The tokens as B operands of TDPBUSD: tile g holds `width` tokens as [K/4][width][4] int8;
// `xs` [K/32][tiles * 16] each token's block scales, `sum16` [K/16][tiles * 16] each 16
// inputs' xs * sum of ints, `sum32` [K/32][tiles * 16] the same over 32.
struct Tokens8 {
    std::vector<int8_t> q;
    std::vector<float> xs, sum16, sum32;
    int64_t width = 0, tiles = 0;
    static constexpr bool paired = false;  // as Tokens reads it: one token a column
};

void lay_out_tokens8(const float* x, int64_t M, int64_t K, Tokens8& t) {
    t.width = std::min(TILE_TOKENS, M);
    t.tiles = (M + t.width - 1) / t.width;
    const int64_t stride = t.tiles * TILE_TOKENS;
    t.q.assign(t.tiles * t.width * K, 0);
    t.xs.assign(K / QK * stride, 0.f);
    t.sum32.assign(K / QK * stride, 0.f);
    t.sum16.assign(K / 16 * stride, 0.f);
    const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int64_t m = 0; m < M; ++m) {
        const int64_t tile = m / t.width, col = m % t.width;
        auto* groups = reinterpret_cast<uint32_t*>(t.q.data() + tile * t.width * K) + col;
        const int64_t at = tile * TILE_TOKENS + col;
        for (int64_t b = 0; b < K / QK; ++b) {
            const float* src = x + m * K + b * QK;
            const __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, absmask), _mm512_and_ps(hi, absmask)));
            const float s = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
            const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(inv)));
            const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(inv)));
            alignas(16) uint32_t bytes[8];
            _mm_store_si128((__m128i*)bytes, _mm512_cvtsepi32_epi8(qlo));
            _mm_store_si128((__m128i*)(bytes + 4), _mm512_cvtsepi32_epi8(qhi));
            for (int i = 0; i < 8; ++i) groups[(b * 8 + i) * t.width] = bytes[i];
            const float slo = s * (float)_mm512_reduce_add_epi32(qlo), shi = s * (float)_mm512_reduce_add_epi32(qhi);
            t.xs[b * stride + at] = s;
            t.sum16[2 * b * stride + at] = slo;
            t.sum16[(2 * b + 1) * stride + at] = shi;
            t.sum32[b * stride + at] = slo + shi;
        }
    }
}

// Tiles 0, 1: products (16 rows x width, int32); 2, 3: the level bytes (16 rows x depth);
// 4, 5: the tokens (depth / 4 groups x width * 4 bytes).
void configure_tiles8(int64_t depth, int64_t width) {
    TileConfig cfg;
    for (int t = 0; t < 6; ++t) {
        cfg.rows[t] = (uint8_t)(t >= 4 ? depth / 4 : ROWS);
        cfg.colsb[t] = (uint16_t)(t == 2 || t == 3 ? depth : width * 4);
    }
    _tile_loadconfig(&cfg);
}

#define PRODUCT8(TC, TA, TB, s)                                                      \
    do {                                                                             \
        _tile_loadd(TA, c.ints + (s) * ROWS * depth, depth);                         \
        _tile_zero(TC);                                                              \
        _tile_loadd(TB, t.q.data() + g * t.width * K + (first + (s) * depth) / 4 * t.width * 4, t.width * 4); \
        _tile_dpbusd(TC, TA, TB);                                                    \
    } while (0)

template <typename Fmt>
void multiply_chunk(const Chunk8& c, int64_t products, int64_t first, const Tokens8& t, int64_t K, float* acc,
                    int32_t (*out)[ROWS][TILE_TOKENS]) {
    constexpr int64_t depth = Fmt::DEPTH;
    const int64_t stride = t.tiles * TILE_TOKENS;
    const std::vector<float>& sums = depth == 32 ? t.sum32 : t.sum16;
    for (int64_t g = 0; g < t.tiles; ++g) {
        float* a = acc + g * ROWS * TILE_TOKENS;
        __m512 rows[ROWS];
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) rows[r] = _mm512_loadu_ps(a + r * TILE_TOKENS);
        int64_t done = 0, n = std::min(GROUP, products);
        ISSUE(PRODUCT8, 0, n);
        store_results(n, out);
        while (done < products) {
            const int64_t next = done + n, m = std::min(GROUP, products - next);
            if (m > 0) ISSUE(PRODUCT8, next, m);
            for (int64_t i = 0; i < n; ++i) {
                const int64_t k0 = first + (done + i) * depth;
                const float *sc = c.scale + done + i, *mn = c.minimum + done + i;
                const __m512 xs = _mm512_loadu_ps(t.xs.data() + (k0 / QK) * stride + g * TILE_TOKENS);
                const __m512 xsum = _mm512_loadu_ps(sums.data() + (k0 / depth) * stride + g * TILE_TOKENS);
#pragma GCC unroll 16
                for (int r = 0; r < ROWS; ++r) {
                    const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(out[i][r])), xs);
                    rows[r] = _mm512_fmadd_ps(p, _mm512_set1_ps(sc[r * MAX_STEPS]), rows[r]);
                    rows[r] = _mm512_fmadd_ps(xsum, _mm512_set1_ps(mn[r * MAX_STEPS]), rows[r]);
                }
            }
            if (m > 0) store_results(m, out);
            done = next;
            n = m;
        }
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) _mm512_storeu_ps(a + r * TILE_TOKENS, rows[r]);
    }
}
#undef PRODUCT8
#undef ISSUE

template <typename Fmt>
void gemm8(const float* x, const Weight& w, const float* bias, float* y, int64_t M, int64_t ldy, int nthreads) {
    static thread_local Tokens8 tokens;
    lay_out_tokens8(x, M, w.K, tokens);
    const Tokens8* t = &tokens;
    const int64_t panels = (w.N + ROWS - 1) / ROWS;
    request_tiles();
#pragma omp parallel num_threads(nthreads)
    {
        alignas(64) int32_t out[GROUP][ROWS][TILE_TOKENS] = {};
        static thread_local Chunk8 chunk;
        static thread_local std::vector<float> acc;
        acc.resize(t->tiles * ROWS * TILE_TOKENS);
        configure_tiles8(Fmt::DEPTH, t->width);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; ++p) {
            const int64_t n0 = p * ROWS, rows = std::min(ROWS, w.N - n0);
            panel_product<Fmt>(w, *t, n0, rows, M, bias ? bias + n0 : nullptr, y + n0, ldy, chunk, acc.data(), out);
        }
        _tile_release();
    }
}

}  // namespace

void set_tile_bf16(bool on) { bf16_tokens.store(on, std::memory_order_relaxed); }

void tile_linear(int64_t kind, const float* x, const uint8_t* qs, const uint16_t* wd, const uint16_t* wm,
                 const float* bias, float* y, int64_t M, int64_t N, int64_t K, int64_t ldy, bool int8, int nthreads) {
    const int64_t sb = K / QK_K;
    if (int8 && M > PAIRED_TOKENS && !bf16_tokens.load(std::memory_order_relaxed)) {
        switch (kind) {
            case KIND_Q4_1: gemm8<Q4_1Bytes>(x, {qs, K / 2, wd, wm, N, K}, bias, y, M, ldy, nthreads); return;
            case KIND_Q4_K: gemm8<KBytes<Q4K>>(x, {qs, sb * Q4K::BYTES, nullptr, nullptr, N, K}, bias, y, M, ldy, nthreads); return;
            case KIND_Q5_K: gemm8<KBytes<Q5K>>(x, {qs, sb * Q5K::BYTES, nullptr, nullptr, N, K}, bias, y, M, ldy, nthreads); return;
            case KIND_Q6_K: gemm8<KBytes<Q6K>>(x, {qs, sb * Q6K::BYTES, nullptr, nullptr, N, K}, bias, y, M, ldy, nthreads); return;
            default: break;  // Q8_0: int8 tokens would be most of an 8-bit weight's error
        }
    }
    switch (kind) {
        case KIND_Q4_1: gemm<Q4_1Ints>(x, {qs, K / 2, wd, wm, N, K}, bias, y, M, ldy, nthreads); break;
        case KIND_Q8_0: gemm<Q8_0Ints>(x, {qs, K, wd, nullptr, N, K}, bias, y, M, ldy, nthreads); break;
        case KIND_Q4_K: gemm<KInts<Q4K>>(x, {qs, sb * Q4K::BYTES, nullptr, nullptr, N, K}, bias, y, M, ldy, nthreads); break;
        case KIND_Q5_K: gemm<KInts<Q5K>>(x, {qs, sb * Q5K::BYTES, nullptr, nullptr, N, K}, bias, y, M, ldy, nthreads); break;
        case KIND_Q6_K: gemm<KInts<Q6K>>(x, {qs, sb * Q6K::BYTES, nullptr, nullptr, N, K}, bias, y, M, ldy, nthreads); break;
        default: break;
    }
}

#endif  // PAGODE_AMX
