// Fused element-wise ops of a Llama decoder step, for the CPU (fp32 activations).
// Plain C ABI, loaded with ctypes. Each replaces several eager torch ops (and their
// temporaries) with one pass over the rows. Built with -ffp-contract=off so the
// arithmetic rounds as torch's does (no fused multiply-adds). The SiLU body is AVX2:
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

}  // extern "C"

#endif  // PAGODE_AVX2
