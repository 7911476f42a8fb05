// Paged decode attention for the CPU, reading K/V in place through block tables.
// One task per (sequence, KV head): its G query heads share each K/V row read.
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
void paged_decode_attention_f32(const float* query, const float* k_cache, const float* v_cache,
                                const int32_t* block_tables, const int32_t* seq_lens, float* out,
                                int64_t B, int64_t H, int64_t D, int64_t BS, int64_t KVH,
                                int64_t MB, float scale, int num_threads) {
  const int64_t G = H / KVH;
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < B * KVH; ++task) {
      const int64_t b = task / KVH, kh = task % KVH;
      const int64_t L = seq_lens[b];
      const float* qb = query + (b * H + kh * G) * D;
      float* ob = out + (b * H + kh * G) * D;
      const int32_t* table = block_tables + b * MB;
      scores.assign(G * L, 0.f);
      for (int64_t t = 0; t < L; ++t) {
        const float* k = k_cache + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * KVH + kh) * D;
        for (int64_t g = 0; g < G; ++g) scores[g * L + t] = dot(qb + g * D, k, D) * scale;
      }
      for (int64_t g = 0; g < G; ++g) {
        float* s = scores.data() + g * L;
        const float m = *std::max_element(s, s + L);
        float sum = 0.f;
        for (int64_t t = 0; t < L; ++t) sum += (s[t] = std::exp(s[t] - m));
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < L; ++t) s[t] *= inv;
      }
      std::fill(ob, ob + G * D, 0.f);
      for (int64_t t = 0; t < L; ++t) {
        const float* v = v_cache + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * KVH + kh) * D;
        for (int64_t g = 0; g < G; ++g) axpy(scores[g * L + t], v, ob + g * D, D);
      }
    }
  }
}

}  // extern "C"
