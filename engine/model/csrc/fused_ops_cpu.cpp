// Fused element-wise ops of a Llama decoder step, for the CPU (fp32 activations).
// Plain C ABI, loaded with ctypes. Each replaces several eager torch ops (and their
// temporaries) with one pass over the rows. Built with -ffp-contract=off so the
// arithmetic rounds as torch's does (no fused multiply-adds).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

// exp for AVX2 (Cephes' polynomial, ~1 ulp on [-87, 88]), as Sleef/torch use for silu.
inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-88.3762626647949f);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, z), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// residual += x (or residual = x), then out = weight * (residual * rsqrt(mean(residual^2) + eps)),
// HF's LlamaRMSNorm order of operations in fp32.
void add_rmsnorm_row(const float* __restrict x, float* __restrict r, const float* __restrict w,
                     float* __restrict out, int64_t n, float eps, bool add) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = add ? r[i] + x[i] : x[i];
    r[i] = v;
    ss += static_cast<double>(v) * v;
  }
  const float mean = static_cast<float>(ss / static_cast<double>(n));
  const float inv = 1.f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (r[i] * inv);
}

}  // namespace

extern "C" {

// x, residual, out [T, N]; weight [N]. add=0: residual is set to x (the first layer).
void add_rmsnorm_f32(const float* x, float* residual, const float* weight, float* out, int64_t T,
                     int64_t N, float eps, int add, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (T > 16) schedule(static)
  for (int64_t t = 0; t < T; ++t)
    add_rmsnorm_row(x + t * N, residual + t * N, weight, out + t * N, N, eps, add != 0);
}

// gate_up [T, 2N] -> out [T, N]: silu(gate) * up, silu(g) = g / (1 + exp(-g)).
void silu_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (T * N > 32768) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * N;
    const float* u = g + N;
    float* o = out + t * N;
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= N; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv))));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < N; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

}  // extern "C"
