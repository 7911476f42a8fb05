// The low-rank deltas of one step's adapter rows, each row on its own adapter (the Punica /
// S-LoRA idea on the CPU): the base projection has already run over every row, reading its
// weights once; here each adapter row adds x . A^T . B^T of its own adapter. The rows are
// ordered by adapter and cut into tiles of a few rows, so that each vector of an adapter's
// matrices is loaded once per tile and each output vector once per row, the rank summed in
// registers; with no allocation beyond the row order, where torch pays a dispatch, a gather
// and a scatter per product. Beside block-quantized base weights the matrices are bf16: a
// step reads each adapter's matrices once, and at fp32 four adapters of rank 16 weigh as much
// as a small model's quantized layers. The same function runs inside the fused decode step
// and, through ctypes, in the layer-by-layer path, so both add the same numbers.
#include "isa.h"

#ifdef PAGODE_AVX2
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lora_delta.h"
#include "simd_vec.h"

namespace {

#ifdef PAGODE_AVX512
using V = pagode_simd::Vec16;
using Reg = V::V;
Reg load(const uint16_t* p) {  // bf16 to fp32: the 16 bits become the high half
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
#else
using V = pagode_simd::Vec8;
using Reg = V::V;
Reg load(const uint16_t* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
#endif
Reg load(const float* p) { return V::load(p); }

float scalar(float w) { return w; }
float scalar(uint16_t w) {
    const uint32_t bits = static_cast<uint32_t>(w) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
}

constexpr int64_t MAX_RANK = 256;  // the Python side sends no larger rank to this kernel

constexpr int64_t TILE = 4;  // rows of one adapter that share each load of its matrices

// A tile of up to TILE rows on one shard: h = x . A^T for every row with each row of A read
// once for the tile, then y += h . Bt with each y vector loaded and stored once, summed over
// the rank in registers, and each Bt vector read once for the tile.
template <typename W>
void add_tile(const int64_t* shard, const float* x, float* y, int64_t K, int64_t N, const int64_t* rows, int64_t n) {
    float h[TILE][MAX_RANK];
    const int64_t first = shard[1], width = shard[2] - shard[1], rank = shard[3];
    const auto* a = reinterpret_cast<const W*>(shard[4]);
    const auto* bt = reinterpret_cast<const W*>(shard[5]);
    const float* xs[TILE];
    float* ys[TILE];
    for (int64_t t = 0; t < n; ++t) {
        xs[t] = x + rows[t] * K;
        ys[t] = y + rows[t] * N + first;
    }
    for (int64_t j = 0; j < rank; ++j) {
        const W* aj = a + j * K;
        Reg acc[TILE];
        for (int64_t t = 0; t < n; ++t) acc[t] = V::zero();
        int64_t i = 0;
        for (; i + V::N <= K; i += V::N) {
            const Reg av = load(aj + i);
            for (int64_t t = 0; t < n; ++t) acc[t] = V::fma(av, V::load(xs[t] + i), acc[t]);
        }
        for (int64_t t = 0; t < n; ++t) {
            float sum = V::hsum(acc[t]);
            for (int64_t k = i; k < K; ++k) sum += scalar(aj[k]) * xs[t][k];
            h[t][j] = sum;
        }
    }
    int64_t i = 0;
    for (; i + V::N <= width; i += V::N) {
        Reg yv[TILE];
        for (int64_t t = 0; t < n; ++t) yv[t] = V::load(ys[t] + i);
        for (int64_t j = 0; j < rank; ++j) {
            const Reg bv = load(bt + j * width + i);
            for (int64_t t = 0; t < n; ++t) yv[t] = V::fma(V::set1(h[t][j]), bv, yv[t]);
        }
        for (int64_t t = 0; t < n; ++t) V::store(ys[t] + i, yv[t]);
    }
    for (; i < width; ++i)
        for (int64_t t = 0; t < n; ++t) {
            float sum = ys[t][i];
            for (int64_t j = 0; j < rank; ++j) sum += h[t][j] * scalar(bt[j * width + i]);
            ys[t][i] = sum;
        }
}

// One unit of work: a shard and a tile of the rows on its adapter.
struct Work {
    const int64_t* shard;
    int64_t first_row, rows;  // into the rows ordered by slot
};

}  // namespace

extern "C" {

void lora_add_f32(const int64_t* table, const float* x, float* y, int64_t M, int64_t K, int64_t N,
                  const int64_t* row_slots, int num_threads) {
    if (table == nullptr || table[0] == 0) return;
    // The adapter rows ordered by slot (a stable counting sort: slots are small), then every
    // shard's rows cut into tiles: the work items, independent (each writes its own rows'
    // columns of its own output range).
    int64_t slots = 0;
    for (int64_t m = 0; m < M; ++m) slots = std::max(slots, row_slots[m] + 1);
    std::vector<int64_t> start(slots + 1, 0), order;
    for (int64_t m = 0; m < M; ++m)
        if (row_slots[m] >= 0) ++start[row_slots[m] + 1];
    for (int64_t s = 0; s < slots; ++s) start[s + 1] += start[s];
    order.resize(start[slots]);
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t m = 0; m < M; ++m)
        if (row_slots[m] >= 0) order[next[row_slots[m]]++] = m;
    std::vector<Work> work;
    const int64_t* shard = table + 1;
    for (int64_t i = 0; i < table[0]; ++i, shard += LORA_SHARD) {
        const int64_t slot = shard[0];
        if (slot < 0 || slot >= slots) continue;
        for (int64_t r = start[slot]; r < start[slot + 1]; r += TILE)
            work.push_back({shard, r, std::min(TILE, start[slot + 1] - r)});
    }
    const int64_t items = static_cast<int64_t>(work.size());
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1) if (items > 1)
    for (int64_t w = 0; w < items; ++w) {
        const Work& item = work[w];
        const int64_t* rows = order.data() + item.first_row;
        if (item.shard[6] == LORA_BF16)
            add_tile<uint16_t>(item.shard, x, y, K, N, rows, item.rows);
        else
            add_tile<float>(item.shard, x, y, K, N, rows, item.rows);
    }
}

}  // extern "C"

#endif  // PAGODE_AVX2
