// The prefill kernel's bf16 products on the AMX tile unit (src/prefill_attention.cpp):
// TDPBF16PS over the bf16 pairs prefill_bf16_body.h packs, key tiles of 64.
#pragma once
#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <cstdint>

#include "amx_tiles.h"
#include "prefill_bf16_body.h"
#include "prefill_scratch.h"
#include "simd_vec.h"

namespace pagode::prefill {

#ifdef PAGODE_AMX
using pagode_simd::Vec16;

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

  static_assert(TILE_ROWS == 16, "the tiles are configured full: 16 rows of 64 bytes");
  static void begin(int64_t) { pagode_amx::configure_full_tiles(); }
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

}  // namespace pagode::prefill

#endif  // PAGODE_AVX2
