// Fused element-wise ops of a decoder step, for the CPU (fp32 activations).
// Plain C ABI, loaded with ctypes. Each replaces several eager torch ops (and their
// temporaries) with one pass over the rows. Built with -ffp-contract=off so the
// arithmetic rounds as torch's does (no fused multiply-adds). The SiLU and GELU bodies are AVX2:
// below the avx2 level this file compiles to nothing.
#include "fused_ops.h"

#include "isa.h"

#ifdef PAGODE_AVX2
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd_exp.h"

namespace {

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
      const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, pagode_simd::exp256(_mm256_sub_ps(zero, gv))));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    for (; i < N; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

// gate_up [T, 2N] -> out [T, N]: gelu_tanh(gate) * up. 0.5 * (1 + tanh(u)) is 1 / (1 + exp(-2u)),
// so gelu_tanh(g) = g / (1 + exp(-2u)) with u = sqrt(2 / pi) * (g + 0.044715 g^3): SiLU's
// form, on the same exp, and free of tanh's cancellation near 0.
void gelu_tanh_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads) {
  constexpr float k0 = 0.7978845608028654f, k1 = 0.044715f;
#pragma omp parallel for num_threads(num_threads) if (T * N > 32768) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gate_up + t * 2 * N;
    const float* u = g + N;
    float* o = out + t * N;
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.f), c1 = _mm256_set1_ps(k1), minus_2k0 = _mm256_set1_ps(-2.f * k0);
    for (; i + 8 <= N; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 inner = _mm256_add_ps(gv, _mm256_mul_ps(c1, _mm256_mul_ps(gv, _mm256_mul_ps(gv, gv))));
      const __m256 e = pagode_simd::exp256(_mm256_mul_ps(minus_2k0, inner));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < N; ++i) {
      const float inner = g[i] + k1 * (g[i] * (g[i] * g[i]));
      o[i] = g[i] / (1.f + std::exp(-2.f * k0 * inner)) * u[i];
    }
  }
}

}  // extern "C"

#endif  // PAGODE_AVX2
