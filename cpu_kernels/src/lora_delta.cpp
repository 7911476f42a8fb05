// The low-rank deltas of one step's adapter rows, each row on its own adapter (the Punica /
// S-LoRA idea on the CPU): the base projection has already run over every row, reading its
// weights once; here each adapter row adds x . A^T . B^T of its own adapter. At decode sizes
// a row's delta is two small matrix-vector products (rank x K, then rank x N), which this
// does in one pass over the rows with no allocation, where torch pays a dispatch per product
// and per output range. Beside block-quantized base weights the matrices are bf16: a step
// reads each adapter's matrices once, and at fp32 four adapters of rank 16 weigh as much as
// a small model's quantized layers. The same function runs inside the fused decode step and, through
// ctypes, in the layer-by-layer path, so both add the same numbers.
#include "isa.h"

#ifdef PAGODE_AVX2
#include <cstdint>
#include <cstring>

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

template <typename W>
float dot(const W* a, const float* x, int64_t n) {
    auto acc = V::zero();
    int64_t i = 0;
    for (; i + V::N <= n; i += V::N) acc = V::fma(load(a + i), V::load(x + i), acc);
    float sum = V::hsum(acc);
    for (; i < n; ++i) sum += scalar(a[i]) * x[i];
    return sum;
}

// y[i] += h * b[i] over n columns.
template <typename W>
void axpy(float h, const W* b, float* y, int64_t n) {
    const auto hv = V::set1(h);
    int64_t i = 0;
    for (; i + V::N <= n; i += V::N) V::store(y + i, V::fma(hv, load(b + i), V::load(y + i)));
    for (; i < n; ++i) y[i] += h * scalar(b[i]);
}

template <typename W>
void add_shard(const int64_t* shard, const float* x, float* y, int64_t K) {
    float h[MAX_RANK];
    const int64_t first = shard[1], width = shard[2] - shard[1], rank = shard[3];
    const auto* a = reinterpret_cast<const W*>(shard[4]);
    const auto* bt = reinterpret_cast<const W*>(shard[5]);
    for (int64_t j = 0; j < rank; ++j) h[j] = dot(a + j * K, x, K);
    for (int64_t j = 0; j < rank; ++j) axpy(h[j], bt + j * width, y + first, width);
}

void add_row(const int64_t* table, const float* x, float* y, int64_t K, int64_t slot) {
    const int64_t* shard = table + 1;
    for (int64_t s = 0; s < table[0]; ++s, shard += LORA_SHARD) {
        if (shard[0] != slot) continue;
        if (shard[6] == LORA_BF16)
            add_shard<uint16_t>(shard, x, y, K);
        else
            add_shard<float>(shard, x, y, K);
    }
}

}  // namespace

extern "C" {

void lora_add_f32(const int64_t* table, const float* x, float* y, int64_t M, int64_t K, int64_t N,
                  const int64_t* row_slots, int num_threads) {
    if (table == nullptr || table[0] == 0) return;
#pragma omp parallel for num_threads(num_threads) schedule(static) if (M > 1)
    for (int64_t m = 0; m < M; ++m)
        if (row_slots[m] >= 0) add_row(table, x + m * K, y + m * N, K, row_slots[m]);
}

}  // extern "C"

#endif  // PAGODE_AVX2
