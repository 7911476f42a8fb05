// The prefill kernel's per-thread scratch (src/prefill_attention.cpp): a task's running
// softmax state and output accumulator, and the buffers its bodies convert and pack tiles
// into, kept across calls so that a step allocates nothing.
#pragma once
#include "isa.h"

#ifdef PAGODE_AVX2
#include <cstdint>
#include <limits>
#include <vector>

namespace pagode::prefill {

// Rows of the tile unit's operands and results: the bf16 bodies pad a task's rows to it.
constexpr int64_t TILE_ROWS = 16;

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

}  // namespace pagode::prefill

#endif  // PAGODE_AVX2
