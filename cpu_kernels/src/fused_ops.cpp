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

// x = weight * (x * rsqrt(mean(x^2) + eps)) in place: add_rmsnorm_row's arithmetic without the add.
void rmsnorm_row_inplace(float* __restrict x, const float* __restrict w, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(ss / static_cast<double>(n));
  const float inv = 1.f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = w[i] * (x[i] * inv);
}

// ---- the gated activations, over fp32 or bf16 rows ----------------------------------------
// bf16 rows are widened to fp32 exactly, computed as the fp32 rows are, and rounded to nearest
// even (NaN to 0x7fc0), as torch rounds: the bf16 form equals the fp32 form followed by
// torch's .to(bfloat16), so a bf16 GEMM's output may feed it without a cast either side.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline void store8(uint16_t* p, __m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) {
  const uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
inline void store1(float* p, float v) { *p = v; }
inline void store1(uint16_t* p, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) { *p = 0x7fc0; return; }
  *p = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// gate_up [T, 2N] -> out [T, N]: silu(gate) * up, silu(g) = g / (1 + exp(-g)).
template <typename E>
void silu_and_mul(const E* gate_up, E* out, int64_t T, int64_t N, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (T * N > 32768) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const E* g = gate_up + t * 2 * N;
    const E* u = g + N;
    E* o = out + t * N;
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.f), zero = _mm256_setzero_ps();
    for (; i + 8 <= N; i += 8) {
      const __m256 gv = load8(g + i);
      const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, pagode_simd::exp256(_mm256_sub_ps(zero, gv))));
      store8(o + i, _mm256_mul_ps(s, load8(u + i)));
    }
    for (; i < N; ++i) {
      const float gi = load1(g + i);
      store1(o + i, gi / (1.f + std::exp(-gi)) * load1(u + i));
    }
  }
}

// gate_up [T, 2N] -> out [T, N]: gelu_tanh(gate) * up. 0.5 * (1 + tanh(u)) is 1 / (1 + exp(-2u)),
// so gelu_tanh(g) = g / (1 + exp(-2u)) with u = sqrt(2 / pi) * (g + 0.044715 g^3): SiLU's
// form, on the same exp, and free of tanh's cancellation near 0.
template <typename E>
void gelu_tanh_and_mul(const E* gate_up, E* out, int64_t T, int64_t N, int num_threads) {
  constexpr float k0 = 0.7978845608028654f, k1 = 0.044715f;
#pragma omp parallel for num_threads(num_threads) if (T * N > 32768) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const E* g = gate_up + t * 2 * N;
    const E* u = g + N;
    E* o = out + t * N;
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.f), c1 = _mm256_set1_ps(k1), minus_2k0 = _mm256_set1_ps(-2.f * k0);
    for (; i + 8 <= N; i += 8) {
      const __m256 gv = load8(g + i);
      const __m256 inner = _mm256_add_ps(gv, _mm256_mul_ps(c1, _mm256_mul_ps(gv, _mm256_mul_ps(gv, gv))));
      const __m256 e = pagode_simd::exp256(_mm256_mul_ps(minus_2k0, inner));
      store8(o + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), load8(u + i)));
    }
    for (; i < N; ++i) {
      const float gi = load1(g + i);
      const float inner = gi + k1 * (gi * (gi * gi));
      store1(o + i, gi / (1.f + std::exp(-2.f * k0 * inner)) * load1(u + i));
    }
  }
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

void qk_rmsnorm_f32(float* qkv, int64_t T, int64_t row_stride, int64_t q_width, int64_t k_width,
                    int64_t q_norm, int64_t k_norm, const float* q_weight, const float* k_weight, float eps,
                    int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (T > 16) schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* q = qkv + t * row_stride;
    for (int64_t i = 0; i < q_width; i += q_norm) rmsnorm_row_inplace(q + i, q_weight, q_norm, eps);
    for (int64_t i = 0; i < k_width; i += k_norm) rmsnorm_row_inplace(q + q_width + i, k_weight, k_norm, eps);
  }
}

void silu_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads) {
  silu_and_mul(gate_up, out, T, N, num_threads);
}
void silu_and_mul_bf16(const uint16_t* gate_up, uint16_t* out, int64_t T, int64_t N, int num_threads) {
  silu_and_mul(gate_up, out, T, N, num_threads);
}
void gelu_tanh_and_mul_f32(const float* gate_up, float* out, int64_t T, int64_t N, int num_threads) {
  gelu_tanh_and_mul(gate_up, out, T, N, num_threads);
}
void gelu_tanh_and_mul_bf16(const uint16_t* gate_up, uint16_t* out, int64_t T, int64_t N, int num_threads) {
  gelu_tanh_and_mul(gate_up, out, T, N, num_threads);
}

}  // extern "C"

#endif  // PAGODE_AVX2
