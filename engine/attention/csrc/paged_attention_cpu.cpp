// Paged decode attention for the CPU, reading K/V in place through block tables.
// Plain C ABI, loaded with ctypes: compiles in about a second, no torch headers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline void axpy(float w, const float* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += w * x[i];
}

}  // namespace

extern "C" {

// query/out [B, H, D]; k_cache/v_cache [NB, BS, KVH, D]; block_tables [B, MB]; seq_lens [B].
// One task per sequence: its K/V rows of all heads are contiguous, so each block is
// streamed once from memory (decode attention is bandwidth-bound on a CPU).
void paged_decode_attention_f32(const float* query, const float* k_cache, const float* v_cache,
                                const int32_t* block_tables, const int32_t* seq_lens, float* out,
                                int64_t B, int64_t H, int64_t D, int64_t BS, int64_t KVH,
                                int64_t MB, float scale, int num_threads) {
  const int64_t G = H / KVH, row = KVH * D;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t L = seq_lens[b];
      const float* qb = query + b * H * D;
      float* ob = out + b * H * D;
      const int32_t* table = block_tables + b * MB;
      scores.assign(H * L, 0.f);
      for (int64_t t = 0; t < L; ++t) {
        const float* k = k_cache + (static_cast<int64_t>(table[t / BS]) * BS + t % BS) * row;
        for (int64_t h = 0; h < H; ++h) scores[h * L + t] = dot(qb + h * D, k + (h / G) * D, D) * scale;
      }
      for (int64_t h = 0; h < H; ++h) {
        float* s = scores.data() + h * L;
        const float m = *std::max_element(s, s + L);
        float sum = 0.f;
        for (int64_t t = 0; t < L; ++t) sum += (s[t] = std::exp(s[t] - m));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < L; ++t) s[t] *= inv;
      }
      std::fill(ob, ob + H * D, 0.f);
      for (int64_t t = 0; t < L; ++t) {
        const float* v = v_cache + (static_cast<int64_t>(table[t / BS]) * BS + t % BS) * row;
        for (int64_t h = 0; h < H; ++h) axpy(scores[h * L + t], v + (h / G) * D, ob + h * D, D);
      }
    }
  }
}

}  // extern "C"
