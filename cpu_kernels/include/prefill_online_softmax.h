// The prefill kernel's online softmax over one key tile (src/prefill_attention.cpp), for
// every body: the running max and sum of each row, its output accumulator rescaled as the
// max grows, the tile's scores turned into probabilities.
#pragma once
#include "isa.h"

#ifdef PAGODE_AVX2
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "prefill_scratch.h"

namespace pagode::prefill {

// ---- the online softmax over one key tile ------------------------------------------
// Row r is query first_pos + r / G; it sees keys j0 + [jlo, jhi) of the tile: causal,
// within the window, inside the kc real keys. s becomes the row's probabilities relative
// to its new running max (0 outside what it sees); l, m and acc follow.
template <class W, int64_t KT>
void online_softmax(Scratch& sc, int64_t n_rows, int64_t G, int64_t first_pos, int64_t j0, int64_t kc,
                    int64_t window, float softcap, int64_t D) {
  using V = typename W::V;
  constexpr int64_t N = W::N;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t p = first_pos + r / G;
    const int64_t jlo = window > 0 ? std::max<int64_t>(0, p - window + 1 - j0) : 0;
    const int64_t jhi = std::min<int64_t>(kc, p - j0 + 1);
    float* s = sc.s.data() + r * KT;
    if (jlo >= jhi) {
      std::fill(s, s + KT, 0.f);
      continue;
    }
    if (softcap > 0.f) {  // Gemma 2's cap, as the decode kernel computes it
      const float inv = 1.f / softcap;
      for (int64_t j = jlo; j < jhi; ++j) s[j] = softcap * std::tanh(s[j] * inv);
    }
    const float m_old = sc.m[r];
    float m_new, sum;
    if (jlo == 0 && jhi == KT) {  // the row sees the whole tile: all in vectors
      V mx = W::load(s);
      for (int64_t j = N; j < KT; j += N) mx = W::max(mx, W::load(s + j));
      m_new = std::max(m_old, W::hmax(mx));
      const V mv = W::set1(m_new);
      V total = W::zero();
      for (int64_t j = 0; j < KT; j += N) {
        const V e = W::exp(W::sub(W::load(s + j), mv));
        W::store(s + j, e);
        total = W::add(total, e);
      }
      sum = W::hsum(total);
    } else {
      m_new = std::max(m_old, *std::max_element(s + jlo, s + jhi));
      const V mv = W::set1(m_new);
      for (int64_t j = 0; j < KT; j += N) W::store(s + j, W::exp(W::sub(W::load(s + j), mv)));
      std::fill(s, s + jlo, 0.f);
      std::fill(s + jhi, s + KT, 0.f);
      sum = 0.f;
      for (int64_t j = jlo; j < jhi; ++j) sum += s[j];
    }
    const float alpha = std::exp(m_old - m_new);  // 0 on the row's first visible tile
    sc.l[r] = sc.l[r] * alpha + sum;
    sc.m[r] = m_new;
    if (alpha != 1.f) {
      float* acc = sc.acc.data() + r * D;
      const V av = W::set1(alpha);
      for (int64_t d = 0; d < D; d += N) W::store(acc + d, W::mul(W::load(acc + d), av));
    }
  }
}

}  // namespace pagode::prefill

#endif  // PAGODE_AVX2
